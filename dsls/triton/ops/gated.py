"""``python_native::swiglu`` and ``python_native::geglu``: ``act(gate) * up``, forward and backward.

The op is declared by ``python_native.ops``; these overrides shadow its reference at the backend
key with the row-tiled activation kernels (``GATED``): one read of each operand, one write of
each result, fp32 math. ``gate`` and ``up`` (and a backward's gradient) may be row views at any
strides: the two halves of a fused projection's ``gate_up.chunk(2, -1)`` are taken as they are,
never copied, and so is an expanded gradient. Results are contiguous.
"""

from __future__ import annotations

import torch

from python_native.ops import gated_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.family import Family, Op

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


FAMILY = Family(DSL_NAME, "gated", [
    Op("swiglu", swiglu_plan_or_why, swiglu_impl, ("gate", "up"), public_name="swiglu", measured=False,
       lib=NAMESPACE, bench=("swiglu", "swiglu_chunked")),
    Op("swiglu_backward", swiglu_backward_plan_or_why, swiglu_backward_impl, ("grad_output", "gate", "up"),
       public_name="swiglu", backward=True, measured=False, lib=NAMESPACE, bench=("swiglu", "swiglu_chunked")),
    Op("geglu", geglu_plan_or_why, geglu_impl, ("gate", "up", "approximate"), public_name="geglu", measured=False,
       lib=NAMESPACE, bench=("geglu",)),
    Op("geglu_backward", geglu_backward_plan_or_why, geglu_backward_impl,
       ("grad_output", "gate", "up", "approximate"), public_name="geglu", backward=True, measured=False,
       lib=NAMESPACE, bench=("geglu",)),
], kernels="activations")
