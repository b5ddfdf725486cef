"""Commands never pass vacuously, and every switch and output says what it means.

``verify`` and ``bench`` with nothing to run fail and say how to run the kernels here; every
option of every command has help; ``bench --plot`` marks rows where no override fired; the status
report lists every variable the package reads and says when an override sits where nothing reaches.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import python_native as pn
from python_native.__main__ import _parser
from python_native.tools import bench

ROOT = Path(__file__).resolve().parent.parent
SWITCHES = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")
BARE = {k: v for k, v in os.environ.items() if k not in SWITCHES}
BARE["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernels: there is something to check")


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "python_native", *args], env=BARE, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@no_gpu
def test_verify_with_nothing_to_check_fails_and_names_the_interpreter_switch():
    proc = _command("verify")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nothing to check" in proc.stdout
    assert "PYTHON_NATIVE_TRITON_INTERPRET=1 python -m python_native verify" in proc.stdout
    assert "all overrides match aten" not in proc.stdout


@no_gpu
def test_bench_without_a_gpu_names_the_interpreter_switch():
    proc = _command("bench", "--quick")
    assert proc.returncode == 2
    assert "PYTHON_NATIVE_TRITON_INTERPRET=1" in proc.stderr, proc.stderr


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_option_of_every_command_has_help(command):
    parser = _subparsers()[command]
    bare = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert bare == []


def test_demo_help_explains_each_option():
    proc = _command("demo", "--help")
    text = " ".join(proc.stdout.split())
    for words in ("LayerNorm or RMSNorm", "MLP's activation", "seed of the weights"):
        assert words in text


def _row(speedup: float, fired: bool, shape: list[int]) -> bench.Row:
    return bench.Row("silu", "fwd+bwd", shape, "float32", fired, 1.0, speedup, speedup, 1, None)


def test_plot_marks_rows_where_no_override_fired(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [_row(1.3, True, [4, 64]), _row(1.0, False, [4, 128]), _row(0.9, False, [4, 256])]
    path = tmp_path / "plot.png"
    assert bench.plot(rows, str(path)) == 2
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _literals_read() -> set[str]:
    """Every environment variable named in the package's sources: our own and the ones we honour."""
    names = set()
    for folder in (ROOT / "python_native", ROOT / "dsls"):
        for path in folder.rglob("*.py"):
            names |= set(re.findall(r"\"((?:PYTHON_NATIVE|TORCH_NATIVE|TORCH_PYTHON_NATIVE|TORCH_DISABLE_NATIVE)_[A-Z_]+"
                                    r"|TRITON_INTERPRET|CUTE_DSL_ARCH|XDG_CACHE_HOME)\"", path.read_text()))
    return names


def test_status_lists_every_variable_the_package_reads():
    listed = {e["name"] for e in pn.status()["environment"]}
    from python_native.foundations import env

    every = {name for names, _ in env.SWITCHES for name in names}
    assert {"PYTHON_NATIVE_CALIBRATION", "PYTHON_NATIVE_CUTEDSL", "PYTHON_NATIVE_CACHE_DIR"} <= listed
    assert _literals_read() <= every, _literals_read() - every
    # Only env.py reads the environment; elsewhere the package only sets what Triton and CuTe DSL read.
    for folder in (ROOT / "python_native", ROOT / "dsls"):
        for path in folder.rglob("*.py"):
            if path.name != "env.py":
                reads = re.findall(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)", path.read_text())
                assert reads == [], (path, reads)


def test_an_override_no_device_here_reaches_says_so(overrides):
    overrides("neg", lambda self: True, lambda self: self * -1 + 1000, key="CUDA")
    entry = next(o for o in pn.status()["overrides"] if o["dsl"] == "testdsl" and o["op"] == "aten::neg")
    if not torch.backends.cuda.is_built():
        assert entry["unreachable"] == "this torch build has no CUDA"
    elif not torch.cuda.is_available():
        assert entry["unreachable"] == "no CUDA device here"
    else:
        assert entry["unreachable"] is None
    from python_native.tools import report

    assert ("never reached: " in report.render(pn.status())) == (entry["unreachable"] is not None)
