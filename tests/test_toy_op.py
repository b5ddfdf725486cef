"""A new op is one declaration: a toy fused op, added the way docs/architecture.md ("Add an op") says, in
a copy of this checkout, is found by verify, bench, the status report and traces with no table edited.

The four files of the op (its custom op schema and reference, its family declaration, its Triton
kernel, its test) are written into a temporary tree holding the package's sources; a process
started on that tree (the Triton kernels in the interpreter, as the other Triton tests run them)
runs the op's own test, then asks the tools for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCHEMA = '''\
"""``python_native::toy_axpb``: ``a * x + b`` in one call."""

import torch

from python_native.foundations import custom_ops, public_names


def _reference(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    return x * a + b


def _fake(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output) -> None:
    ctx.a = inputs[1]


def _backward(ctx, grad_output):
    return grad_output * ctx.a, None, None


TOY_AXPB = custom_ops.declare("toy_axpb(Tensor x, float a, float b) -> Tensor", reference=_reference, fake=_fake,
                            backward=_backward, setup_context=_setup_context, doc="a * x + b")
public_names.declare("toy_axpb", "toy_axpb")
'''

FAMILY = '''\
"""``python_native::toy_axpb`` on one Triton kernel: contiguous inputs, as flat arrays."""

import torch

from python_native.ops import toy_op  # noqa: F401  (declares the op overridden here)
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import BenchRow, Driver, Sample, elementwise_bytes, rand, x_input

from ..target import DSL_NAME
from . import why


def plan_or_why(x, a, b):
    found = why.device(x) or why.dtype(x)
    if found:
        return found
    if not x.is_contiguous():
        return "x is not contiguous"
    return ("flat", 1024) if x.numel() else "empty input"


def toy_axpb_impl(x, a, b, plan=None):
    plan = plan or FAMILY["toy_axpb"].require(x, a, b)
    return FAMILY.kernels().run(x, a, b, plan[1])


def _cases(dtype, device):
    call = lambda x: torch.ops.python_native.toy_axpb(x, 2.0, 0.5)  # noqa: E731
    yield Sample("odd width", call, [rand(3, 37, dtype=dtype, device=device)])
    yield Sample("several blocks", call, [rand(5, 1000, dtype=dtype, device=device)])


ROW = BenchRow("toy_axpb", ((4, 64),), ((8192, 4096),), x_input(),
               lambda t: torch.ops.python_native.toy_axpb(t["x"], 2.0, 0.5), elementwise_bytes(2, 4),
               lambda t: t["x"] * 2.0 + 0.5)

FAMILY = Family(DSL_NAME, "toy", [
    Op("toy_axpb", plan_or_why, toy_axpb_impl, ("x",), public_name="toy_axpb", lib="python_native",
       measured=False, verify=Driver(_cases), bench_rows=(ROW,)),
], kernels="toy")
'''

KERNEL = '''\
"""``a * x + b`` over a flat array, in fp32."""

import torch
import triton
import triton.language as tl

from .launch import Launcher


@triton.jit
def _axpb_kernel(X, Y, n, a, b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    tl.store(Y + offs, (x * a + b).to(Y.dtype.element_ty), mask=mask)


_AXPB = Launcher(_axpb_kernel, ("BLOCK",), fresh=("Y",), op="toy_axpb")


def run(x: torch.Tensor, a: float, b: float, block: int) -> torch.Tensor:
    y = torch.empty_like(x)
    _AXPB((triton.cdiv(x.numel(), block),), (x, y, x.numel(), a, b), 4, block)
    return y
'''

TEST = '''\
import torch

import python_native as pn


def test_toy_axpb_runs_its_kernel_and_matches_its_reference():
    x = torch.randn(4, 100, requires_grad=True)
    with pn.trace() as t:
        y = torch.ops.python_native.toy_axpb(x, 2.0, 0.5)
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == "toy_axpb"}
    torch.testing.assert_close(y, x.detach() * 2.0 + 0.5)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
'''

# What the tools say of the op, asked in the process started on the tree.
PROBE = '''\
import json
import torch
import python_native as pn
from python_native.tools import bench, verify

report = verify.verify(op="toy_axpb", max_samples=2, dtypes=(torch.float32, torch.float16))
x = torch.randn(3, 50)
with pn.trace() as t:
    torch.ops.python_native.toy_axpb(x, 2.0, 0.5)
triton = next(d for d in pn.status()["dsls"] if d["name"] == "triton")
rows = bench.run_rows(bench.cases([torch.float32], quick=True, ops=["toy_axpb"]), "cpu", inductor=False)
print(json.dumps({
    "verify": [(r["op"], r["status"], r["fired"]) for r in report["rows"]], "ok": report["ok"],
    "trace": sorted({(e.dsl, e.op, e.outcome) for e in t.events}),
    "status": "toy_axpb" in triton["operations"], "skipped": triton["skipped"],
    "bench_ops": "toy_axpb" in bench.OPS, "bench": [(r.op, r.mode, r.fired) for r in rows],
    "symbols": bench.symbols_of(["toy_axpb"]),
}))
'''

OP_FILES = {  # the op's files, by their paths in the tree
    "python_native/ops/toy_op.py": SCHEMA,
    "python_native_dsls/triton/ops/toy.py": FAMILY,
    "python_native_dsls/triton/kernels/toy.py": KERNEL,
    "tests/test_toy.py": TEST,
}


def _tree(tmp: Path) -> Path:
    """This checkout's package sources (``dsls`` under its import name) and the op's four files."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "python_native", tmp / "python_native", ignore=ignore)
    shutil.copytree(ROOT / "dsls", tmp / "python_native_dsls", ignore=ignore)
    for path, text in OP_FILES.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(text)
    return tmp


def _run(tree: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", "PYTHONPATH": str(tree),
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHON_NATIVE_DISABLE", None)
    return subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two processes importing the package and running the interpreter: about half a minute
def test_a_toy_op_in_four_files_is_found_by_verify_bench_status_and_trace(tmp_path):
    tree = _tree(tmp_path)
    own = _run(tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_toy.py")
    assert own.returncode == 0, own.stdout + own.stderr
    probe = _run(tree, "-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["ok"] and found["verify"] and {op for op, *_ in found["verify"]} == {"toy_axpb"}, found["verify"]
    assert all(status == "ok" and fired for _, status, fired in found["verify"]), found["verify"]
    assert ["triton", "toy_axpb", "override"] in found["trace"], found["trace"]
    assert found["status"] and "toy" not in found["skipped"]
    assert found["bench_ops"] and found["symbols"] == ["toy_axpb"]
    assert found["bench"] == [["toy_axpb", "fwd", True], ["toy_axpb", "fwd+bwd", True]], found["bench"]
