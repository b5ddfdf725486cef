"""``python_native::swiglu`` and ``python_native::geglu``: ``act(gate) * up``, forward and backward.

The op is declared by ``python_native.ops``; these overrides shadow its reference at the backend
key with the row-tiled activation kernels (``GATED``): one read of each operand, one write of
each result, fp32 math. ``gate`` and ``up`` (and a backward's gradient) may be row views at any
strides: the two halves of a fused projection's ``gate_up.chunk(2, -1)`` are taken as they are,
never copied, and so is an expanded gradient. Results are contiguous.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.ops import gated_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.spec import runtime_import

from ..plans.elementwise import RowsPlan, plan_rows, unit_rows
from ..target import DSL_NAME
from . import why
from .planned import PlanOrReason, declared_spec

Tensor = torch.Tensor

SILU = 0
GELU_MODES = {"none": 1, "tanh": 2}  # values match python_native_dsls.triton.kernels.activations


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import activations

    return activations


def _gated(act: int | None, approximate: str, *named: tuple[str, Tensor]) -> RowsPlan | str:
    """The tiles over ``named`` (gate, up, then a backward's grad_output), or why not."""
    if act is None:
        return f"approximate={approximate!r} (takes 'none' or 'tanh')"
    found = why.pointwise(*named)
    if found:
        return found
    tensors = [t for _, t in named]
    plan = plan_rows(tuple(unit_rows(t, unit=False) for t in tensors), act, True, tuple(t.dtype for t in tensors))
    return plan or f"rows of {tensors[0].shape[-1]} columns exceed the kernels' grid"


def _swiglu_plan(gate: Tensor, up: Tensor) -> RowsPlan | str:
    return _gated(SILU, "", ("gate", gate), ("up", up))


def _swiglu_backward_plan(grad_output: Tensor, gate: Tensor, up: Tensor) -> RowsPlan | str:
    return _gated(SILU, "", ("gate", gate), ("up", up), ("grad_output", grad_output))


def _geglu_plan(gate: Tensor, up: Tensor, approximate: str) -> RowsPlan | str:
    return _gated(GELU_MODES.get(approximate), approximate, ("gate", gate), ("up", up))


def _geglu_backward_plan(grad_output: Tensor, gate: Tensor, up: Tensor, approximate: str) -> RowsPlan | str:
    return _gated(GELU_MODES.get(approximate), approximate, ("gate", gate), ("up", up), ("grad_output", grad_output))


SWIGLU = PlanOrReason(_swiglu_plan)
SWIGLU_BACKWARD = PlanOrReason(_swiglu_backward_plan)
GEGLU = PlanOrReason(_geglu_plan)
GEGLU_BACKWARD = PlanOrReason(_geglu_backward_plan)


def swiglu_impl(gate: Tensor, up: Tensor, plan: RowsPlan | None = None) -> Tensor:
    return _kernels().run_forward(gate, plan or SWIGLU.require(gate, up), up)


def swiglu_backward_impl(grad_output: Tensor, gate: Tensor, up: Tensor,
                         plan: RowsPlan | None = None) -> tuple[Tensor, Tensor]:
    return _kernels().run_backward(grad_output, gate, plan or SWIGLU_BACKWARD.require(grad_output, gate, up), up)


def geglu_impl(gate: Tensor, up: Tensor, approximate: str = "none", plan: RowsPlan | None = None) -> Tensor:
    return _kernels().run_forward(gate, plan or GEGLU.require(gate, up, approximate), up)


def geglu_backward_impl(grad_output: Tensor, gate: Tensor, up: Tensor, approximate: str,
                        plan: RowsPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or GEGLU_BACKWARD.require(grad_output, gate, up, approximate)
    return _kernels().run_backward(grad_output, gate, plan, up)


OVERRIDES = [
    declared_spec("swiglu", SWIGLU, swiglu_impl, "swiglu"),
    declared_spec("swiglu_backward", SWIGLU_BACKWARD, swiglu_backward_impl, "swiglu", backward=True),
    declared_spec("geglu", GEGLU, geglu_impl, "geglu"),
    declared_spec("geglu_backward", GEGLU_BACKWARD, geglu_backward_impl, "geglu", backward=True),
]
