"""``python -m python_native inspect`` reports the MoE kernels (routing forward and backward, the
grouped GEMM with its activation fused, the plain grouped GEMM, the experts' weight gradients) at the
bench rows' shapes, each compiled for sm_90a without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

MOE_KERNELS = {"_route_kernel", "_route_backward_kernel", "_gate_up_kernel", "_grouped_kernel",
               "_expert_outer_kernel"}


@pytest.mark.slow  # the MoE rows planned and every kernel variant compiled for sm_90a: about 30 s
def test_every_moe_kernel_is_planned_and_compiled_for_sm90a():
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
    argv = ["inspect", "--arch", "sm_90a", "--dtype", "bfloat16", "--op", "moe_route,moe_experts", "--no-bytes",
            "--json"]
    proc = subprocess.run([sys.executable, "-m", "python_native", *argv], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.stdout, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert {case["label"] for case in report["cases"]} >= {"moe_experts fwd+bwd 8192x2048x768x128x8",
                                                          "moe_route fwd+bwd 8192x128x8"}
    calls = [call for case in report["cases"] for call in case["calls"]]
    assert not [call["op"] for call in calls if call["declined"]]  # the conds take every row
    launches = [launch for call in calls for launch in call["launches"]]
    assert {launch["kernel"] for launch in launches} >= MOE_KERNELS
    for launch in launches:
        fig = launch["compiled"]
        assert "error" not in fig, (launch["kernel"], fig.get("error"))
        assert 0 < fig["regs"] <= 255 and launch["occupancy"]["resident_warps"] > 0
