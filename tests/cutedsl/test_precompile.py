"""``python -m python_native precompile``: builds into the cache, and a second run reuses every entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cutedsl_testing import INSTALLED, requires_cutlass

ARGS = ["--op", "_fused_rms_norm", "--op", "_log_softmax", "--dtype", "float16", "--size-class", "short", "--json"]


def _precompile(cache, *args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "python_native", "precompile", "--cache-dir", str(cache), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


@requires_cutlass
def test_second_run_reuses_every_entry(tmp_path):
    first = _precompile(tmp_path, *ARGS)
    assert first.returncode == 0, first.stderr[-3000:]
    data = json.loads(first.stdout)
    kernels = data["kernels"]
    assert {k["op"] for k in kernels} == {"_fused_rms_norm", "_log_softmax"}
    # RMS norm with and without weight, log-softmax fp16 -> fp16 and fp16 -> fp32 (half_to_float),
    # each plain and vectorized
    assert len(kernels) == 8
    assert sum("vec" in k["flags"] for k in kernels) == 4
    assert all(k["dtype"] == "float16" and k["size_class"] == "short" and k["ms"] > 0 for k in kernels)
    assert [k["cached"] for k in kernels] == [False] * 8 and data["compiled"] == 8
    assert data["arch"] == "sm_90a" and data["cache_dir"] == str(tmp_path)

    second = json.loads(_precompile(tmp_path, *ARGS).stdout)
    assert [k["cached"] for k in second["kernels"]] == [True] * 8
    assert (second["compiled"], second["cached"], second["failed"]) == (0, 8, 0)
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".bin"]) == 8


@requires_cutlass
def test_filters_that_match_nothing_fail_clearly(tmp_path):
    r = _precompile(tmp_path, "--op", "not_an_op")
    assert r.returncode == 1 and "no specialization matches" in r.stdout


@pytest.mark.skipif(INSTALLED, reason="CuTe DSL is installed")
def test_without_cutlass_it_says_what_to_install(tmp_path):
    r = _precompile(tmp_path, "--dsl", "cutedsl")
    assert r.returncode == 1 and "nvidia-cutlass-dsl not installed" in r.stdout
