"""Whether replay is on: ``PYTHON_NATIVE_REPLAY``, else a proof of a GPU run for this GPU and versions.

The machine's GPUs are read through NVML; here a stand-in names one, and proofs are written where
``bench --prove-replay`` writes them (the user cache, which the suite isolates).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import python_native as pn
from conftest import compiled_front_problem
from python_native.features import front
from python_native.features.front import proof, replay
from python_native.foundations import nvml
from python_native.tools import report

GPU = "Fake GPU 80GB/sm90"


@pytest.fixture
def decided(monkeypatch):
    """``replay.decide`` on a machine with one fake GPU; replay put back as it was afterwards."""
    monkeypatch.setattr(nvml, "device_keys", lambda: frozenset({GPU}))
    was, why = replay.STATE.on, replay.STATE.why
    shutil.rmtree(proof.folder(), ignore_errors=True)

    def decide() -> tuple[bool, str]:
        replay.decide()
        return replay.STATE.on, replay.STATE.why

    yield decide
    replay._switch(was, why)
    shutil.rmtree(proof.folder(), ignore_errors=True)


def _cases() -> list[dict]:
    return [{"case": "softmax 8x64 float32", "op": "_softmax", "passed": True, "problem": ""}]


def test_the_variable_forces_replay_either_way(decided, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_REPLAY", "1")
    assert decided() == (True, "PYTHON_NATIVE_REPLAY=1")
    monkeypatch.setenv("PYTHON_NATIVE_REPLAY", "0")
    proof.write(GPU, _cases(), True)
    assert decided() == (False, "PYTHON_NATIVE_REPLAY=0")


def test_a_malformed_value_warns_and_counts_as_unset(decided, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_REPLAY", "sometimes")
    with pytest.warns(UserWarning, match="PYTHON_NATIVE_REPLAY"):
        on, why = decided()
    assert not on and "not proven" in why


def test_off_without_a_gpu(decided, monkeypatch):
    monkeypatch.delenv("PYTHON_NATIVE_REPLAY", raising=False)
    monkeypatch.setattr(nvml, "device_keys", lambda: None)
    on, why = decided()
    assert not on and "no GPU" in why


def test_on_where_a_passing_proof_names_this_gpu_and_these_versions(decided, monkeypatch):
    monkeypatch.delenv("PYTHON_NATIVE_REPLAY", raising=False)
    on, why = decided()
    assert not on and proof.PROVE in why and GPU in why
    path = proof.write(GPU, _cases(), True)
    assert path.parent == proof.folder() and oct(path.stat().st_mode & 0o777) == "0o600"
    on, why = decided()
    assert on and str(path) in why


@pytest.mark.parametrize("spoil, says", [
    (lambda d: {**d, "torch": "1.0.0"}, "was made with torch"),
    (lambda d: {**d, "device": "Other GPU/sm80"}, "names device"),
    (lambda d: {**d, "result": "fail"}, "does not record a passing run"),
    (lambda d: [d], "not a proof"),
])
def test_a_proof_for_something_else_is_named_and_ignored(decided, monkeypatch, spoil, says):
    monkeypatch.delenv("PYTHON_NATIVE_REPLAY", raising=False)
    path = proof.write(GPU, _cases(), True)
    path.write_text(json.dumps(spoil(json.loads(path.read_text()))))
    on, why = decided()
    assert not on and says in why and str(path) in why


def test_a_proof_others_may_write_is_not_trusted(decided, monkeypatch):
    monkeypatch.delenv("PYTHON_NATIVE_REPLAY", raising=False)
    path = proof.write(GPU, _cases(), True)
    os.chmod(path, 0o666)
    on, why = decided()
    assert not on and "writable by others" in why
    path.unlink()
    path.mkdir()  # not a regular file
    on, why = decided()
    assert not on and "not a small regular file" in why


@pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem()))
def test_the_status_report_says_whether_replay_is_on_and_why(decided, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_REPLAY", "1")
    with front.serving("compiled"):
        decided()
        data = pn.status()
        assert data["front"]["replay"]["on"] and data["front"]["replay"]["why"] == "PYTHON_NATIVE_REPLAY=1"
        assert "replay: on (PYTHON_NATIVE_REPLAY=1)" in report.render(data)
    assert any(e["name"] == "PYTHON_NATIVE_REPLAY" for e in data["environment"])


def test_proving_needs_a_gpu_and_says_so():
    # No GPU visible to the command, on a machine with one too.
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "python_native", "bench", "--prove-replay"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "--prove-replay needs a CUDA GPU" in proc.stderr, proc.stderr[-2000:]
