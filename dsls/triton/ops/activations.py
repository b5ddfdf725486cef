"""``silu``, ``gelu`` (``approximate`` 'none' or 'tanh') and their backward ops.

Dense layouts (contiguous, channels-last, permuted) with every operand sharing shape and strides
run as one flat launch that keeps the input's layout. Row views with a contiguous last dim (the
halves of ``gate_up.chunk(2, -1)``, row slices, each operand at its own row stride) run as tiles
of rows into a contiguous result, as aten lays out such results; other layouts go to aten. The
in-place and ``out=`` variants copy that result into their target.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.spec import OverrideSpec, runtime_import

from ..plans.elementwise import (
    ElementwisePlan,
    RowsPlan,
    plan_elementwise,
    pointwise_backward_plan,
    pointwise_plan,
)
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor

_GELU_MODES = {"none": 1, "tanh": 2}  # values match python_native_dsls.triton.kernels.activations
_SILU = 0


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import activations

    return activations


Plan = ElementwisePlan | RowsPlan


def _forward_plan(x: Tensor, act: int) -> Plan | None:
    return pointwise_plan(x, act, unit=True)


def _backward_plan(grad: Tensor, x: Tensor, act: int) -> Plan | None:
    return pointwise_backward_plan(grad, x, act, unit=True)


_FORWARD_PLANS: SpecializationCache[Plan | None] = SpecializationCache(_forward_plan, 4096)
_BACKWARD_PLANS: SpecializationCache[Plan | None] = SpecializationCache(_backward_plan, 4096)
_forward_lookup = _FORWARD_PLANS.lookup
_backward_lookup = _BACKWARD_PLANS.lookup


def forward_plan(x: Tensor, act: int) -> Plan | None:
    """The plan where the kernel takes ``act(x)``, else None; cached per layout for real tensors."""
    if x.__class__ is not Tensor:
        return _forward_plan(x, act)
    key = (x.size(), x.stride(), x.dtype, x.is_cuda, x.is_cpu, act)
    plan = _forward_lookup(key, MISSING)
    return _FORWARD_PLANS.get(key, x, act) if plan is MISSING else plan


def backward_plan(grad: Tensor, x: Tensor, act: int) -> Plan | None:
    """The plan where the kernel takes ``grad * act'(x)``, else None."""
    if x.__class__ is not Tensor or grad.__class__ is not Tensor:
        return _backward_plan(grad, x, act)
    key = (
        x.size(), x.stride(), x.dtype, x.is_cuda, x.is_cpu,
        grad.size(), grad.stride(), grad.dtype, grad.is_cuda, grad.is_cpu, act,
    )
    plan = _backward_lookup(key, MISSING)
    return _BACKWARD_PLANS.get(key, grad, x, act) if plan is MISSING else plan


def _forward_any(x: Tensor, act: int) -> Plan:
    return forward_plan(x, act) or plan_elementwise(x, act)


def _backward_any(grad: Tensor, x: Tensor, act: int) -> Plan:
    return backward_plan(grad, x, act) or plan_elementwise(x, act, grad)


# Conds return their plan (None: declined); the router hands it to the impl as ``plan``. An impl
# called alone plans from the layout itself.


def silu_cond(self: Tensor) -> Plan | None:
    return forward_plan(self, _SILU)


def silu_impl(self: Tensor, plan: Plan | None = None) -> Tensor:
    return _kernels().run_forward(self, plan or _forward_any(self, _SILU))


def silu_backward_cond(grad_output: Tensor, self: Tensor) -> Plan | None:
    return backward_plan(grad_output, self, _SILU)


def silu_backward_impl(grad_output: Tensor, self: Tensor, plan: Plan | None = None) -> Tensor:
    return _kernels().run_backward(grad_output, self, plan or _backward_any(grad_output, self, _SILU))


def gelu_cond(self: Tensor, *, approximate: str) -> Plan | None:
    act = _GELU_MODES.get(approximate)
    return None if act is None else forward_plan(self, act)


def gelu_impl(self: Tensor, *, approximate: str, plan: Plan | None = None) -> Tensor:
    return _kernels().run_forward(self, plan or _forward_any(self, _GELU_MODES[approximate]))


def gelu_backward_cond(grad_output: Tensor, self: Tensor, *, approximate: str) -> Plan | None:
    act = _GELU_MODES.get(approximate)
    return None if act is None else backward_plan(grad_output, self, act)


def gelu_backward_impl(
    grad_output: Tensor, self: Tensor, *, approximate: str, plan: Plan | None = None
) -> Tensor:
    return _kernels().run_backward(
        grad_output, self, plan or _backward_any(grad_output, self, _GELU_MODES[approximate])
    )


# Why a cond declined (asked by traced calls only): the same checks, one by one.


def silu_explain(self: Tensor) -> str | None:
    return why.elementwise(self, rows="unit")


def silu_backward_explain(grad_output: Tensor, self: Tensor) -> str | None:
    return why.elementwise(self, grad_output, rows="unit")


def _mode(approximate: str) -> str | None:
    return None if approximate in _GELU_MODES else f"approximate={approximate!r} (takes 'none' or 'tanh')"


def gelu_explain(self: Tensor, *, approximate: str) -> str | None:
    return _mode(approximate) or why.elementwise(self, rows="unit")


def gelu_backward_explain(grad_output: Tensor, self: Tensor, *, approximate: str) -> str | None:
    return _mode(approximate) or why.elementwise(self, grad_output, rows="unit")


OVERRIDES = [
    OverrideSpec.planned("silu", silu_cond, silu_impl, public_name="silu", explain=silu_explain),
    OverrideSpec.planned("silu_backward", silu_backward_cond, silu_backward_impl, public_name="silu", backward=True,
                          explain=silu_backward_explain),
    OverrideSpec.planned("gelu", gelu_cond, gelu_impl, public_name="gelu", explain=gelu_explain),
    OverrideSpec.planned("gelu_backward", gelu_backward_cond, gelu_backward_impl, public_name="gelu", backward=True,
                          explain=gelu_backward_explain),
]
