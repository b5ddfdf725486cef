"""``python_native::swiglu`` and ``python_native::geglu``: ``act(gate) * up``, forward and backward.

The op is declared by ``python_native.ops``; these overrides shadow its reference at the backend
key with the row-tiled activation kernels (``GATED``): one read of each operand, one write of
each result, fp32 math. ``gate`` and ``up`` (and a backward's gradient) may be row views at any
strides: the two halves of a fused projection's ``gate_up.chunk(2, -1)`` are taken as they are,
never copied, and so is an expanded gradient. Results are contiguous.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from python_native.ops import gated_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import BenchRow, Driver, Sample, elementwise_bytes, leaf, rand

from ..plans.elementwise import RowsPlan, plan_rows, unit_rows
from ..plans.layout import MAX_INDEX
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
NAMESPACE = "python_native"

SILU = 0
GELU_MODES = {"none": 1, "tanh": 2}  # values match python_native_dsls.triton.kernels.activations


def _gated(act: int | None, approximate: str, *named: tuple[str, Tensor]) -> RowsPlan | str:
    """The tiles over ``named`` (gate, up, then a backward's grad_output), or why not."""
    if act is None:
        return f"approximate={approximate!r} (takes 'none' or 'tanh')"
    found = why.pointwise(*named)
    if found:
        return found
    tensors = [t for _, t in named]
    rows = tuple(unit_rows(t, unit=False) for t in tensors)
    plan = plan_rows(rows, act, True, tuple(t.dtype for t in tensors))
    if plan is None and rows[0] is not None and rows[0].n_rows > MAX_INDEX:
        return f"{rows[0].n_rows} rows exceed the kernels' int32 row indices (at most {MAX_INDEX})"
    return plan or f"rows of {tensors[0].shape[-1]} columns exceed the kernels' grid or int32 in-row offsets"


def swiglu_plan_or_why(gate: Tensor, up: Tensor) -> RowsPlan | str:
    return _gated(SILU, "", ("gate", gate), ("up", up))


def swiglu_backward_plan_or_why(grad_output: Tensor, gate: Tensor, up: Tensor) -> RowsPlan | str:
    return _gated(SILU, "", ("gate", gate), ("up", up), ("grad_output", grad_output))


def geglu_plan_or_why(gate: Tensor, up: Tensor, approximate: str) -> RowsPlan | str:
    return _gated(GELU_MODES.get(approximate), approximate, ("gate", gate), ("up", up))


def geglu_backward_plan_or_why(grad_output: Tensor, gate: Tensor, up: Tensor, approximate: str) -> RowsPlan | str:
    return _gated(GELU_MODES.get(approximate), approximate, ("gate", gate), ("up", up), ("grad_output", grad_output))


def swiglu_impl(gate: Tensor, up: Tensor, plan: RowsPlan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(gate, plan or FAMILY["swiglu"].require(gate, up), up)


def swiglu_backward_impl(grad_output: Tensor, gate: Tensor, up: Tensor,
                         plan: RowsPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or FAMILY["swiglu_backward"].require(grad_output, gate, up)
    return FAMILY.kernels().run_backward(grad_output, gate, plan, up)


def geglu_impl(gate: Tensor, up: Tensor, approximate: str = "none", plan: RowsPlan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(gate, plan or FAMILY["geglu"].require(gate, up, approximate), up)


def geglu_backward_impl(grad_output: Tensor, gate: Tensor, up: Tensor, approximate: str,
                        plan: RowsPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or FAMILY["geglu_backward"].require(grad_output, gate, up, approximate)
    return FAMILY.kernels().run_backward(grad_output, gate, plan, up)


def _ops():
    return torch.ops.python_native


def _cases(op: str, modes: tuple[str | None, ...]):
    """``verify``'s cases of ``op``, each with the next of ``modes`` (geglu's ``approximate``; None:
    swiglu's none): the halves of a fused gate/up projection, separate projections, row slices."""
    def call(approximate: str | None):
        if approximate is None:
            return lambda g, u: getattr(_ops(), op)(g, u)
        return lambda g, u: getattr(_ops(), op)(g, u, approximate)

    def cases(dtype: torch.dtype, device: str):
        gate, up = rand(3, 2, 2 * 37, dtype=dtype, device=device, scale=3.0).chunk(2, -1)
        inputs = {
            "halves of a fused gate_up": [gate, up],
            "separate projections": [rand(5, 64, dtype=dtype, device=device), rand(5, 64, dtype=dtype, device=device)],
            "row slices": [rand(4, 48, dtype=dtype, device=device)[:, 8:40], rand(4, 32, dtype=dtype, device=device)],
        }
        for mode, (name, tensors) in zip(itertools.cycle(modes), inputs.items()):
            yield Sample(name if mode is None else f"{name}, approximate={mode!r}", call(mode), tensors)
    return cases


def _inputs(chunked: bool):
    """A row's gate and up of its ``(rows, columns)``: two projections, or the halves of one."""
    def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
        m, n = shape
        dy = torch.randn(m, n, device=device, dtype=dtype) if grad else None
        if chunked:
            gate_up = leaf(torch.randn(m, 2 * n, device=device, dtype=dtype), grad)
            return {"gate_up": gate_up, "leaves": [gate_up] if grad else [], "dy": dy}
        gate, up = (leaf(torch.randn(m, n, device=device, dtype=dtype), grad) for _ in range(2))
        return {"gate": gate, "up": up, "leaves": [gate, up] if grad else [], "dy": dy}
    return inputs


def _gate_up(t: dict) -> tuple[Tensor, Tensor]:
    return t["gate_up"].chunk(2, -1) if "gate_up" in t else (t["gate"], t["up"])


# LLM MLP intermediates (11008, 14336 columns); gate, up, y move (backward: dy, gate, up, dgate, dup).
_SHAPES = ((4, 64),), ((8192, 11008), (4096, 14336))
_SWIGLU = [BenchRow(name, *_SHAPES, _inputs(name == "swiglu_chunked"), lambda t: _ops().swiglu(*_gate_up(t)),
                    elementwise_bytes(3, 8), lambda t: F.silu(_gate_up(t)[0]) * _gate_up(t)[1])
           for name in ("swiglu", "swiglu_chunked")]
_GEGLU = BenchRow("geglu", ((4, 64),), ((8192, 11008),), _inputs(False), lambda t: _ops().geglu(*_gate_up(t), "tanh"),
                  elementwise_bytes(3, 8), lambda t: F.gelu(_gate_up(t)[0], approximate="tanh") * _gate_up(t)[1])

FAMILY = Family(DSL_NAME, "gated", [
    Op("swiglu", swiglu_plan_or_why, swiglu_impl, ("gate", "up"), public_name="swiglu", measured=False,
       lib=NAMESPACE, verify=Driver(_cases("swiglu", (None,))), bench_rows=tuple(_SWIGLU)),
    Op("swiglu_backward", swiglu_backward_plan_or_why, swiglu_backward_impl, ("grad_output", "gate", "up"),
       public_name="swiglu", backward=True, measured=False, lib=NAMESPACE, bench=("swiglu", "swiglu_chunked")),
    Op("geglu", geglu_plan_or_why, geglu_impl, ("gate", "up", "approximate"), public_name="geglu", measured=False,
       lib=NAMESPACE, verify=Driver(_cases("geglu", ("tanh", "none"))), bench_rows=(_GEGLU,)),
    Op("geglu_backward", geglu_backward_plan_or_why, geglu_backward_impl,
       ("grad_output", "gate", "up", "approximate"), public_name="geglu", backward=True, measured=False,
       lib=NAMESPACE, bench=("geglu",)),
], kernels="activations")
