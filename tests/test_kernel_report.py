"""``python -m python_native inspect`` at sm_90a: the row kernels spill nothing, move at most 1.10x
their op's minimum bytes and leave an SM enough resident warps, or are listed with a reason in
``python_native/tools/kernel_report/exceptions.py``; and the checks find what they are meant to find.

The suite covers the row ops (and the gated and rotary kernels of the declared model ops) in bfloat16 (the dtype of the LLM rows, whose launch configs the tuning
table chooses per dtype); ``python -m python_native inspect --check`` runs the full sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from python_native.tools.kernel_report import arch, checks
from python_native.tools.kernel_report.exceptions import Excuse

ROW_OPS = ("rms_norm", "layer_norm", "softmax", "log_softmax", "silu", "swiglu_chunked", "rotary")


def _inspect(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "python_native", "inspect", *argv], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def report() -> dict:
    argv = ["--arch", "sm_90a", "--dtype", "bfloat16", "--json", "--check"]
    for op in ROW_OPS:
        argv += ["--op", op]
    proc = _inspect(*argv)
    assert proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    out["returncode"] = proc.returncode
    return out


@pytest.mark.slow  # the row kernels compiled for sm_90a and counted in the interpreter: minutes
def test_every_row_is_planned_compiled_and_counted(report):
    assert report["arch"] == "sm_90a" and report["sm_count"] == 132
    seen = {case["op"] for case in report["cases"]}
    assert seen == set(ROW_OPS)
    launches = [launch for case in report["cases"] for call in case["calls"] for launch in call["launches"]]
    assert len(launches) >= 40
    for launch in launches:
        fig = launch["compiled"]
        assert "error" not in fig, fig
        assert 0 < fig["regs"] <= 255 and fig["num_warps"] == launch["num_warps"]
        assert launch["bytes"] > 0 and launch["occupancy"]["resident_warps"] > 0
    for case in report["cases"]:
        for call in case["calls"]:
            # Never below the minimum: the counting would have missed a tensor.
            assert call["ratio"] >= 0.999, (case["label"], call)


@pytest.mark.slow
def test_no_open_findings_at_sm90a(report):
    open_ = [f for f in report["findings"] if f["excused"] is None]
    assert not open_, "\n".join(f"[{f['check']}] {f['kernel']} at {f['case']}: {f['measured']}" for f in open_)
    assert report["returncode"] == 0


def _synthetic(local: int = 0, ratio: float = 1.0, regs: int = 32, warps: int = 8) -> dict:
    occ = arch.occupancy(arch.arch("sm_90a"), regs, warps, 0)
    launch = {"kernel": "_k", "programs": 4096, "compiled": {"regs": regs, "local": local, "shared": 0,
              "num_warps": warps}, "bytes": 100.0 * ratio,
              "occupancy": {"resident_warps": occ.resident_warps, "limit": occ.limit}}
    call = {"op": "_op", "declined": False, "launches": [launch], "bytes": 100.0 * ratio, "minimum": 100.0,
            "ratio": ratio}
    return {"cases": [{"op": "x", "label": "x fwd 8x8", "dtype": "bfloat16", "calls": [call]}]}


def test_checks_bite():
    assert checks.check(_synthetic()) == []
    found = {f.check for f in checks.check(_synthetic(local=24, ratio=1.2, regs=128))}
    assert found == {"spill", "traffic", "warps"}  # 128 registers x 8 warps: 2 programs, 16 warps per SM
    excuse = Excuse("spill", "_k", "a reason", "24 B/thread")
    [spill] = [f for f in checks.check(_synthetic(local=24), [excuse])]
    assert spill.excused is excuse and not checks.open_findings([spill])
    [stale] = checks.check(_synthetic(), [excuse])
    assert stale.check == "stale" and stale.excused is None
    # An entry for another dtype or row neither excuses nor goes stale here.
    other = Excuse("spill", "_k", "r", "c", dtype="float32")
    assert [f.check for f in checks.check(_synthetic(local=8), [other])] == ["spill"]


def test_occupancy_follows_the_architecture_table():
    h100 = arch.arch("sm_90a")
    assert arch.occupancy(h100, 32, 8, 0).resident_warps == 64
    assert arch.occupancy(h100, 64, 8, 0).resident_warps == 32  # 64 x 32 x 32 = 64K registers
    assert arch.occupancy(h100, 33, 4, 0).resident_warps == 48  # 40 registers a thread after rounding: 51 warps, 12 programs
    assert arch.occupancy(h100, 32, 4, 100 * 1024).limit == "shared memory"


def test_bad_options_are_named(capsys):
    from python_native.__main__ import main

    assert main(["inspect", "--op", "sofmax"]) == 2
    err = capsys.readouterr().err
    assert "'sofmax'" in err and "softmax" in err
    assert main(["inspect", "--arch", "sm_75"]) == 2
    assert "sm_90a" in capsys.readouterr().err
    assert main(["inspect", "--dtype", "float64"]) == 2
    assert "bfloat16" in capsys.readouterr().err
