"""``python -m python_native inspect`` reports the MoE kernels (routing forward and backward, the
grouped GEMM with its activation fused, the plain grouped GEMM, the experts' weight gradients) at the
bench rows' shapes, each compiled for sm_90a without a GPU and counted in the interpreter, and
``--check`` finds nothing that ``kernel_report/exceptions.py`` does not excuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

MOE_KERNELS = {"_route_kernel", "_route_backward_kernel", "_gate_up_kernel", "_grouped_kernel",
               "_expert_outer_kernel"}


@pytest.fixture(scope="module")
def report() -> dict:
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
    argv = ["inspect", "--arch", "sm_90a", "--dtype", "bfloat16", "--op", "moe_route,moe_experts", "--json", "--check"]
    proc = subprocess.run([sys.executable, "-m", "python_native", *argv], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.stdout, proc.stderr[-3000:]
    return {**json.loads(proc.stdout), "returncode": proc.returncode}


@pytest.mark.slow  # the MoE rows planned, compiled for sm_90a and counted in the interpreter: about 2 minutes
def test_every_moe_kernel_is_planned_compiled_and_counted(report):
    assert {case["label"] for case in report["cases"]} >= {"moe_experts fwd+bwd 8192x2048x768x128x8",
                                                          "moe_route fwd+bwd 8192x128x8"}
    calls = [call for case in report["cases"] for call in case["calls"]]
    assert not [call["op"] for call in calls if call["declined"]]  # the conds take every row
    launches = [launch for call in calls for launch in call["launches"]]
    assert {launch["kernel"] for launch in launches} >= MOE_KERNELS
    for launch in launches:
        fig = launch["compiled"]
        assert "error" not in fig, (launch["kernel"], fig.get("error"))
        assert 0 < fig["regs"] <= 255 and launch["occupancy"]["resident_warps"] > 0 and launch["bytes"] > 0
    assert all(call["ratio"] >= 0.999 for call in calls)  # never below the minimum: no tensor missed


@pytest.mark.slow
def test_no_open_findings_for_the_moe_kernels_at_sm90a(report):
    open_ = [f for f in report["findings"] if f["excused"] is None]
    assert not open_, "\n".join(f"[{f['check']}] {f['kernel']} at {f['case']}: {f['measured']}" for f in open_)
    assert report["returncode"] == 0
