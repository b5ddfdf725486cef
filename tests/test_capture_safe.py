"""Every override's launch path is safe inside a CUDA graph capture: a static check, on CPU.

A captured graph replays the kernels it recorded; the host code around them runs once, at
capture. So an impl must not read tensor data on the host (``.item()``, ``.tolist()``, ``int(t[0])``,
a tensor's truth), copy to the host (``.cpu()``, ``.numpy()``, ``.to("cpu")``), synchronise
(``torch.cuda.synchronize()``, ``.synchronize()``) or size its output by the data (``.nonzero()``,
``torch.unique``, ``torch.masked_select``, ...): any of those fails or freezes a value at capture.
The check parses every module of the backends (``dsls/``), host code only (``@triton.jit`` and
CuTe DSL kernel bodies run on the device), and names each finding that is not known to read host
data (tensor shapes, schema lists) or listed below with why it is safe.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ROOT / "dsls"

DEVICE_DECORATORS = {"jit", "autotune", "heuristics", "kernel"}  # triton.jit/autotune/heuristics, cute.jit/kernel
SYNC_METHODS = {"item", "cpu", "tolist", "numpy", "nonzero", "synchronize"}
SYNC_TORCH = {"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere", "repeat_interleave"}
TRUTH_CALLS = {"any", "all", "equal", "allclose", "is_nonzero"}

# Subscripts of these are host data by construction: reading them reads no tensor.
HOST_DATA = {
    r"(\w+\.)?shape(\(\))?": "a tensor's sizes live on the host",
    r"(\w+\.)?stride\(\)": "a tensor's strides live on the host",
    r"output_mask": "a bool[] schema argument: a Python list",
    r"spatial|(\w+\.)?grid": "tuples a plan computes on the host from sizes",
    r"struct\.unpack\(.*\)": "Python bytes, not a tensor",
}

# Findings that are safe where they are, each with why: (file, function, finding) -> why.
EXCEPTIONS = {
    ("dsls/triton/ops/scatter_add.py", "_check_bounds", "truth of status[0]"):
        "the CPU branch only (the interpreter): on CUDA the same check is torch._assert_async, which captures",
    ("dsls/triton/ops/scatter_add.py", "_check_bounds", "int(status[1])"):
        "the CPU branch only, raising aten's error for a bad index: no CUDA graph there",
    ("dsls/triton/ops/dropout.py", "_judge", "truth of run.grads[0]"):
        "verify's judge of dropout's results, declared beside the op for the verify command and never on a "
        "launch path; and it tests `is None`, not a tensor's truth",
    ("dsls/triton/ops/gated.py", "_gated", "truth of rows[0]"):
        "rows holds row views (sizes and strides of the inputs), not tensors",
    ("dsls/triton/kernels/compiled_kernels.py", "_param", "truth of code[0]"):
        "code is a str (a parameter's type code), not a tensor",
    **{("dsls/triton/kernels/moe.py", "Sorted.__init__", found):
       "the experts' cond declines while a CUDA graph captures (ops/moe.py): grouping tokens by expert sizes "
       "the launch grid from the per-expert counts, read on the host" for found in (".tolist()", "torch.repeat_interleave()")},
    **{("dsls/triton/kernels/compiled_kernels.py", "describe", f"int(g[{i}])"):
       "g is the launch grid, a tuple of Python ints, not a tensor" for i in range(3)},
}


def _decorator(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _host_data(node: ast.Subscript) -> bool:
    base = ast.unparse(node.value)
    return any(re.fullmatch(pattern, base) for pattern in HOST_DATA)


class _Scan(ast.NodeVisitor):
    """Findings of one module's host code: ``(function, what)``."""

    def __init__(self) -> None:
        self.where: list[str] = []
        self.found: list[tuple[str, str]] = []

    def _hit(self, what: str) -> None:
        self.found.append((".".join(self.where) or "<module>", what))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if any(_decorator(d) in DEVICE_DECORATORS for d in node.decorator_list):
            return  # a kernel body: device code
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute):
            if f.attr in SYNC_METHODS:
                self._hit(f".{f.attr}()")
            if isinstance(f.value, ast.Name) and f.value.id == "torch" and f.attr in SYNC_TORCH:
                self._hit(f"torch.{f.attr}()")
            if f.attr == "to" and any(isinstance(a, ast.Constant) and a.value == "cpu" for a in node.args):
                self._hit('.to("cpu")')
        if isinstance(f, ast.Name) and f.id in {"int", "float", "bool"} and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Subscript) and not _host_data(arg):
                self._hit(f"{f.id}({ast.unparse(arg)})")
        self.generic_visit(node)

    def _truth(self, expr: ast.expr) -> None:
        """A host decision on ``expr``: a tensor's element or reduction there is a device read."""
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            return self._truth(expr.operand)
        if isinstance(expr, ast.BoolOp):
            for value in expr.values:
                self._truth(value)
            return None
        parts = [expr.left, *expr.comparators] if isinstance(expr, ast.Compare) else [expr]
        for part in parts:
            if isinstance(part, ast.Subscript) and not _host_data(part):
                self._hit(f"truth of {ast.unparse(part)}")
            if isinstance(part, ast.Call) and isinstance(part.func, ast.Attribute) and part.func.attr in TRUTH_CALLS:
                self._hit(f"truth of .{part.func.attr}()")
        return None

    def visit_If(self, node: ast.If | ast.While | ast.IfExp | ast.Assert) -> None:
        self._truth(node.test)
        self.generic_visit(node)

    visit_While = visit_IfExp = visit_Assert = visit_If


def scan(source: str) -> list[tuple[str, str]]:
    """``(function, finding)`` for each capture hazard in ``source``'s host code."""
    found = _Scan()
    found.visit(ast.parse(source))
    return found.found


def _findings() -> dict[tuple[str, str, str], None]:
    out: dict[tuple[str, str, str], None] = {}
    for path in sorted(BACKENDS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for function, what in scan(path.read_text()):
            out[(rel, function, what)] = None
    return out


def test_every_backend_launch_path_is_capture_safe():
    found = _findings()
    assert len(list(BACKENDS.rglob("*.py"))) > 20  # the backends are there to check
    unexplained = [key for key in found if key not in EXCEPTIONS]
    assert not unexplained, "host syncs or host reads of tensor data in launch paths (fix them, or decline " \
        "while torch.cuda.is_current_stream_capturing(), or list them in EXCEPTIONS with why):\n" + \
        "\n".join(f"  {f}: {fn}: {what}" for f, fn, what in unexplained)
    stale = [key for key in EXCEPTIONS if key not in found]
    assert not stale, f"EXCEPTIONS lists findings the sources no longer have; remove them: {stale}"


@pytest.mark.parametrize("source, finding", [
    ("def f(t):\n    return t.item()", ".item()"),
    ("def f(t):\n    return t.sum().cpu()", ".cpu()"),
    ("def f(t):\n    return t.tolist()", ".tolist()"),
    ("def f(t):\n    return t.nonzero()", ".nonzero()"),
    ("import torch\ndef f(t):\n    torch.cuda.synchronize()", ".synchronize()"),
    ("import torch\ndef f(t):\n    return torch.unique(t)", "torch.unique()"),
    ("def f(t):\n    return t.to('cpu')", '.to("cpu")'),
    ("def f(t):\n    return int(t[0])", "int(t[0])"),
    ("def f(t):\n    if t[0] > 1:\n        return 1", "truth of t[0]"),
    ("def f(t):\n    return 1 if not t.any() else 2", "truth of .any()"),
])
def test_the_check_finds_each_kind_of_hazard(source, finding):
    assert scan(source) == [("f", finding)]


def test_the_check_passes_host_metadata_and_kernel_bodies():
    source = (
        "import triton\n"
        "def plan(x, output_mask):\n"
        "    if x.shape[0] > 1 and output_mask[1]:\n"
        "        return int(x.shape[-1])\n"
        "@triton.jit\n"
        "def kernel(X):\n"
        "    v = X.item()\n"
    )
    assert scan(source) == []
