"""Benchmark rows of the ops model patching routes to (``torch.ops.python_native.*``), read from their
declarations (``Op.bench_rows``, ``python_native_dsls.proving``).

Each row calls the op: with the overrides on, the Triton kernels; with the DSL disabled (the
"aten" column), the op's reference, which is the plain-torch formula of the module the op
replaces, as an unpatched model runs it. Inductor compiles that formula (``FORMULAS``), not the
op. Shapes are those of LLM training steps (each declaration says which); the MoE rows are
GEMM-bound, so their figure of merit is time (``moe_flops`` gives the FLOPs a rate is taken from).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native_dsls.catalogue import built_ops
from python_native_dsls.proving import BenchRow


def _declared() -> dict[str, BenchRow]:
    """The rows the declarations carry, by name, in declaration order (the first op to declare a name wins)."""
    found: dict[str, BenchRow] = {}
    for built in built_ops():
        for row in built.op.bench_rows:
            found.setdefault(row.name, row)
    return found


DECLARED = _declared()
# op -> (quick shapes, full shapes)
SHAPES: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    name: (list(row.quick), list(row.full)) for name, row in DECLARED.items()}
OPS = tuple(SHAPES)
FUNCTIONS: dict[str, Callable[[dict], object]] = {name: row.call for name, row in DECLARED.items()}
FORMULAS: dict[str, Callable[[dict], object]] = {name: row.formula for name, row in DECLARED.items() if row.formula}


def make_inputs(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
    """The row's tensors by name (``leaves``: those gradients are reset for; ``dy``: the gradient
    the output(s) receive)."""
    return DECLARED[op].inputs(shape, dtype, device, grad)


def bytes_moved(op: str, shape: tuple[int, ...], mode: str, itemsize: int) -> int:
    """What the op must move: every input read once, every output written once (forward; the
    backward reads the forward's inputs and the output gradients and writes the input gradients)."""
    return DECLARED[op].bytes(shape, mode, itemsize)


def moe_flops(op: str, shape: tuple[int, ...], mode: str) -> int:
    """The GEMM FLOPs of a ``moe_experts`` row (two multiply-adds per weight per routed token: gate/up
    and down forward; the backward twice that again, inputs' and weights' gradients); 0 for others."""
    if op != "moe_experts":
        return 0
    tokens, hidden, inner, _, k = shape
    forward = 2 * tokens * k * 3 * inner * hidden
    return forward * (3 if mode == "fwd+bwd" else 1)
