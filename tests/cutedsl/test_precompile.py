"""``python -m python_native precompile``: builds into the cache, and a second run reuses every entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cutedsl_testing import INSTALLED, requires_cutlass

# A public name (rms_norm: forward and backward) and, in a comma list, a backward's aten name (just it).
# --dsl cutedsl: the kernels only (with --cache-dir, --dsl all would also build the front into it).
ARGS = ["--dsl", "cutedsl", "--op", "rms_norm,_log_softmax_backward_data", "--dtype", "float16", "--size-class", "short",
        "--json"]


def _precompile(cache, *args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "python_native", "precompile", "--cache-dir", str(cache), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


@pytest.mark.slow
@requires_cutlass
def test_second_run_reuses_every_entry(tmp_path):
    first = _precompile(tmp_path, *ARGS)
    assert first.returncode == 0, first.stderr[-3000:]
    data = json.loads(first.stdout)
    kernels = data["kernels"]
    assert {k["op"] for k in kernels} == {"_fused_rms_norm", "_fused_rms_norm_backward", "_log_softmax_backward_data"}
    # RMS norm forward with and without weight, each plain and vectorized; its backward with and
    # without weight; the log-softmax backward
    assert len(kernels) == 7
    assert sum("vec" in k["flags"] for k in kernels) == 2
    assert all(k["dtype"] == "float16" and k["size_class"] == "short" and k["ms"] > 0 for k in kernels)
    assert [k["cached"] for k in kernels] == [False] * 7 and data["compiled"] == 7
    assert data["arch"] == "sm_90a" and data["cache_dir"] == str(tmp_path)

    second = json.loads(_precompile(tmp_path, *ARGS).stdout)
    assert [k["cached"] for k in second["kernels"]] == [True] * 7
    assert (second["compiled"], second["cached"], second["failed"]) == (0, 7, 0)
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".bin"]) == 7


@pytest.fixture
def in_process(tmp_path, monkeypatch, capsys):
    """``precompile`` run by ``main`` in this process (the options are checked before anything is
    imported that a subprocess would pay for again); what it sets in the environment is undone."""
    from python_native.__main__ import main

    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    monkeypatch.setenv("PYTHON_NATIVE_CACHE_DIR", str(tmp_path))

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["precompile", "--cache-dir", str(tmp_path), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@requires_cutlass
def test_filters_that_match_nothing_fail_clearly(in_process):
    code, _, err = in_process("--op", "not_an_op")
    assert code == 2 and "--op 'not_an_op' unknown" in err and "allowed: " in err


@pytest.mark.skipif(INSTALLED, reason="CuTe DSL is installed")
def test_without_cutlass_it_says_what_to_install(tmp_path):
    r = _precompile(tmp_path, "--dsl", "cutedsl")
    assert r.returncode == 1 and "nvidia-cutlass-dsl not installed" in r.stdout


@requires_cutlass
@pytest.mark.parametrize(
    ("args", "named", "allowed"),
    [(["--arch", "sm_999"], "--arch 'sm_999'", "sm_90a"), (["--arch", "sm90a"], "did you mean sm_90, sm_90a", "sm_80"),
     (["--op", "bmm"], "--op 'bmm'", "rms_norm"), (["--dtype", "fp16"], "--dtype 'fp16'", "bfloat16"),
     (["--size-class", "huge"], "--size-class 'huge'", "short, medium, long")],
    ids=["arch", "arch-typo", "op", "dtype", "size-class"],
)
def test_bad_options_are_answered_in_one_line_before_compiling(in_process, tmp_path, args, named, allowed):
    code, out, err = in_process(*args)
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1, err[-2000:]
    assert named in err and "allowed: " in err and allowed in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())  # nothing compiled


@pytest.mark.slow
@requires_cutlass
def test_progress_counts_kernels_with_an_eta(tmp_path):
    proc = _precompile(tmp_path, "--dsl", "cutedsl", "--op", "amax", "--dtype", "float32", "--size-class", "short")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line[:5] for line in lines[:2]] == ["[1/2,", "[2/2,"]
    assert all(" eta " in line and "amax" in line for line in lines[:2])
    assert lines[-1].startswith("2 compiled, 0 reused")
