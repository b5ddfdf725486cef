"""``benchmarks/moe_layer.py``'s Liger-Kernel row: where Liger-Kernel is installed, its fused MoE runs
the layer's own stacked expert weights and agrees with transformers' eager loop; where it is not, the
script says why there is no row."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "moe_layer.py"


@pytest.mark.slow  # a subprocess importing transformers; with Liger, its kernels in Triton's interpreter
def test_liger_row_agrees_with_eager_or_says_why_it_is_missing():
    installed = importlib.util.find_spec("liger_kernel") is not None
    argv = [sys.executable, str(SCRIPT), "--small", "--shape", "qwen3_moe", "--tokens", "32", "--repeat", "1"]
    env = {**os.environ, "LIGER_FUSED_MOE_AUTOTUNE": "0", "TRITON_INTERPRET": "1"}
    proc = subprocess.run(argv + (["--interpreted"] if installed else []), capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.split()}
    if not installed:
        assert "no liger row: Liger-Kernel is not installed" in proc.stdout and "liger" not in rows, proc.stdout
        return
    assert rows["liger"][1] == "-", proc.stdout  # none of the package's ops served it
    assert float(rows["liger"][-1]) < 1e-5, proc.stdout  # max |diff| against eager
