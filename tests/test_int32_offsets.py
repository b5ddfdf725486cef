"""The static int32 check of ``python -m python_native inspect``: ``offsets.int32_sites`` names the
source lines where a kernel computes an address in int32 arithmetic that can pass 2**31, on small
TTIR programs written here and on a real kernel compiled for sm_90a; ``checks`` reports each site
unless an entry of the exceptions names it with its cond's bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from python_native.tools.kernel_report import checks, offsets
from python_native.tools.kernel_report.exceptions import EXCEPTIONS, Excuse

ROOT = Path(__file__).resolve().parents[1]

# Each case: the ops of one function (``L<n>`` is the source line an op comes from) and the
# source lines its sites must be. The function takes %X (a pointer), %n and %stride (int32) and
# %big (int64).
CASES = {
    "program id times a block": ("""
        %c128 = arith.constant 128 : i32 loc(L1)
        %pid = tt.get_program_id x : i32 loc(L2)
        %o = arith.muli %pid, %c128 : i32 loc(L2)
        %p = tt.addptr %X, %o : !tt.ptr<f32>, i32 loc(L3)
    """, [2]),
    "widened before the product": ("""
        %c128 = arith.constant 128 : i64 loc(L1)
        %pid = tt.get_program_id x : i32 loc(L2)
        %w = arith.extsi %pid : i32 to i64 loc(L2)
        %o = arith.muli %w, %c128 : i64 loc(L2)
        %p = tt.addptr %X, %o : !tt.ptr<f32>, i64 loc(L3)
    """, []),
    "a tile of constants": ("""
        %c2 = arith.constant dense<2> : tensor<128xi32> loc(L1)
        %r = tt.make_range {end = 128 : i32, start = 0 : i32} : tensor<128xi32> loc(L2)
        %o = arith.muli %r, %c2 : tensor<128xi32> loc(L2)
        %s = tt.splat %X : !tt.ptr<f32> -> tensor<128x!tt.ptr<f32>> loc(L3)
        %p = tt.addptr %s, %o : tensor<128x!tt.ptr<f32>>, tensor<128xi32> loc(L3)
    """, []),
    "an argument bounded by a constant remainder": ("""
        %c7 = arith.constant 7 : i32 loc(L1)
        %m = arith.remsi %n, %c7 : i32 loc(L2)
        %o = arith.muli %m, %c7 : i32 loc(L3)
        %p = tt.addptr %X, %o : !tt.ptr<f32>, i32 loc(L4)
    """, []),
    "a loaded index times a stride": ("""
        %i = tt.load %X : !tt.ptr<f32> loc(L1)
        %o = arith.muli %i, %stride : i32 loc(L2)
        %p = tt.addptr %X, %o : !tt.ptr<f32>, i32 loc(L3)
    """, [2]),
    "a loop counter times a stride": ("""
        %c0 = arith.constant 0 : i32 loc(L1)
        %c1 = arith.constant 1 : i32 loc(L1)
        %r = scf.for %iv = %c0 to %n step %c1 iter_args(%acc = %c0) -> (i32)  : i32 {
          %o = arith.muli %iv, %stride : i32 loc(L2)
          %p = tt.addptr %X, %o : !tt.ptr<f32>, i32 loc(L3)
          scf.yield %acc : i32 loc(L3)
        } loc(L4)
    """, [2]),
    "an int64 argument": ("""
        %o = arith.muli %big, %big : i64 loc(L2)
        %p = tt.addptr %X, %o : !tt.ptr<f32>, i64 loc(L3)
    """, []),
    "int32 arithmetic no address depends on": ("""
        %pid = tt.get_program_id x : i32 loc(L2)
        %o = arith.muli %pid, %stride : i32 loc(L2)
        %p = tt.addptr %X, %n : !tt.ptr<f32>, i32 loc(L3)
    """, []),
}


def _ttir(source: Path, body: str) -> str:
    for line in range(9, 0, -1):
        body = body.replace(f"loc(L{line})", f'loc("{source}":{line}:1)')
    return "\n".join([
        f'#loc = loc("{source}":1:1)',
        "module {",
        "  tt.func public @k(%X: !tt.ptr<f32> loc(#loc), %n: i32 loc(#loc), %stride: i32 loc(#loc), "
        "%big: i64 loc(#loc)) attributes {noinline = false} {",
        *(f"    {line.strip()}" for line in body.strip().splitlines()),
        "    tt.return loc(#loc)",
        "  } loc(#loc)",
        "} loc(#loc)",
    ])


@pytest.mark.parametrize("case", list(CASES))
def test_sites_of_hand_written_programs(case, tmp_path):
    source = tmp_path / "kernel.py"
    source.write_text("".join(f"source line {i}\n" for i in range(1, 10)))
    body, lines = CASES[case]
    sites = offsets.int32_sites(_ttir(source, body))
    assert [s.line for s in sites] == lines
    assert all(s.describe() == f"source line {s.line} (kernel.py:{s.line})" for s in sites)


REQUEST = {
    "module": "python_native_dsls.triton.kernels.softmax_rows", "kernel": "_softmax_fwd_kernel",
    "constexprs": {"LOG": False, "BLOCK_M": 4, "BLOCK_N": 1024}, "num_warps": 4,
    "args": [{"tensor": "bfloat16", "aligned": True}, {"tensor": "bfloat16", "aligned": True}, 4096, 1000, 1000, 1],
}


def test_sites_of_a_real_kernel_compiled_for_sm90a():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHON_NATIVE_TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-m", "python_native.tools.kernel_report.compile_worker", "90"],
                          input=json.dumps([REQUEST]), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    if proc.returncode != 0 or not proc.stdout:
        pytest.skip(f"Triton cannot compile for sm_90a here: {proc.stderr.strip()[-500:]}")
    [figures] = json.loads(proc.stdout)
    assert "int32_error" not in figures, figures
    lines = sorted(int(site.rsplit(":", 1)[1].rstrip(")")) for site in figures["int32"])
    # The row offset ``program_id * BLOCK_M`` and the in-row ``cols * stride_xn`` are int32; the store
    # addresses rows after ``rows.to(tl.int64)`` and is not a site.
    assert lines == [20, 26], figures["int32"]


def _report(sites: list[str]) -> dict:
    launch = {"kernel": "_k", "programs": 4, "compiled": {"regs": 32, "local": 0, "shared": 0, "num_warps": 4,
                                                          "int32": sites},
              "bytes": 100.0, "occupancy": {"resident_warps": 64, "limit": "registers"}}
    call = {"op": "_op", "declined": False, "launches": [launch], "bytes": 100.0, "minimum": 100.0, "ratio": 1.0}
    return {"cases": [{"op": "x", "label": "x fwd 8x8", "dtype": "bfloat16", "calls": [call]}]}


def test_checks_report_sites_the_exceptions_do_not_bound():
    sites = ["offs = pid * BLOCK (k.py:7)", "d = tl.load(X + idx * stride) (k.py:15)"]
    assert [(f.check, f.measured) for f in checks.check(_report(sites), ())] == [("int32", s) for s in sites]
    bound = Excuse("int32", "_k", "the cond declines inputs past 2**31 - 2**20 elements", "none", site="offs = ")
    found = checks.check(_report(sites), [bound])
    assert [f.excused for f in found] == [bound, None]
    assert [f.check for f in checks.check(_report([]), [bound])] == ["stale"]


def test_every_int32_excuse_names_its_conds_bound():
    entries = [e for e in EXCEPTIONS if e.check == "int32"]
    assert entries
    for ex in entries:
        assert "2**31 - 2**20" in ex.reason and ("MAX_INDEX" in ex.reason or "MAX_COLS" in ex.reason), ex
        assert ex.cost.startswith("none within the bound"), ex
