"""``python_native::gelu_tanh`` and ``python_native::quick_gelu``, forward and backward.

The ops are declared by ``python_native.ops``: the hand-written activations of model code (GPT-2's
tanh-GELU formula, CLIP's ``x * sigmoid(1.702 * x)``), which otherwise run as several pointwise
aten calls. These overrides run them on the activation kernels of ``silu`` and ``gelu``, with the
layouts of ``silu``'s, and more: dense ones keep their layout, row views at any strides (an
expanded gradient among them) give contiguous results.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.ops import activation_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.spec import runtime_import

from ..plans.elementwise import pointwise_backward_plan, pointwise_plan
from ..target import DSL_NAME
from . import why
from .activations import Plan
from .planned import PlanOrReason, declared_spec

Tensor = torch.Tensor

GELU_TANH = 2
QUICK_GELU = 3  # values match python_native_dsls.triton.kernels.activations


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import activations

    return activations


def _forward(act: int, x: Tensor) -> Plan | str:
    return pointwise_plan(x, act, unit=False) or why.elementwise(x, rows="any") or "rows too wide for the kernels' grid"


def _backward(act: int, grad_output: Tensor, x: Tensor) -> Plan | str:
    plan = pointwise_backward_plan(grad_output, x, act, unit=False)
    if plan is not None:
        return plan
    if grad_output.shape != x.shape:
        return f"grad_output shape {tuple(grad_output.shape)} differs from the input's {tuple(x.shape)}"
    return why.elementwise(x, grad_output, rows="any") or "rows too wide for the kernels' grid"


GELU_TANH_FORWARD = PlanOrReason(functools.partial(_forward, GELU_TANH))
GELU_TANH_BACKWARD = PlanOrReason(functools.partial(_backward, GELU_TANH))
QUICK_GELU_FORWARD = PlanOrReason(functools.partial(_forward, QUICK_GELU))
QUICK_GELU_BACKWARD = PlanOrReason(functools.partial(_backward, QUICK_GELU))


def gelu_tanh_impl(x: Tensor, plan: Plan | None = None) -> Tensor:
    return _kernels().run_forward(x, plan or GELU_TANH_FORWARD.require(x))


def gelu_tanh_backward_impl(grad_output: Tensor, x: Tensor, plan: Plan | None = None) -> Tensor:
    return _kernels().run_backward(grad_output, x, plan or GELU_TANH_BACKWARD.require(grad_output, x))


def quick_gelu_impl(x: Tensor, plan: Plan | None = None) -> Tensor:
    return _kernels().run_forward(x, plan or QUICK_GELU_FORWARD.require(x))


def quick_gelu_backward_impl(grad_output: Tensor, x: Tensor, plan: Plan | None = None) -> Tensor:
    return _kernels().run_backward(grad_output, x, plan or QUICK_GELU_BACKWARD.require(grad_output, x))


OVERRIDES = [
    declared_spec("gelu_tanh", GELU_TANH_FORWARD, gelu_tanh_impl, "gelu_tanh"),
    declared_spec("gelu_tanh_backward", GELU_TANH_BACKWARD, gelu_tanh_backward_impl, "gelu_tanh", backward=True),
    declared_spec("quick_gelu", QUICK_GELU_FORWARD, quick_gelu_impl, "quick_gelu"),
    declared_spec("quick_gelu_backward", QUICK_GELU_BACKWARD, quick_gelu_backward_impl, "quick_gelu",
                  backward=True),
]
