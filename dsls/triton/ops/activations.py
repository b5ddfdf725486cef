"""``silu``, ``gelu`` (``approximate`` 'none' or 'tanh') and their backward ops.

Accepted layouts are the dense ones (contiguous, channels-last, permuted) with every operand
sharing shape and strides; broadcasting or gappy views go to aten.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native_dsls.family import Family, Op

from ..plans.elementwise import ElementwisePlan, plan_elementwise
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor

_GELU_MODES = {"none": 1, "tanh": 2}  # values match python_native_dsls.triton.kernels.activations
_SILU = 0


def _mode(approximate: str) -> int | str:
    """The kernels' code of a GELU ``approximate``, else why not."""
    return _GELU_MODES.get(approximate, f"approximate={approximate!r} (takes 'none' or 'tanh')")


def silu_plan_or_why(self: Tensor) -> ElementwisePlan | str:
    return why.elementwise(self) or plan_elementwise(self, _SILU)


def silu_backward_plan_or_why(grad_output: Tensor, self: Tensor) -> ElementwisePlan | str:
    return why.elementwise(self, grad_output) or plan_elementwise(self, _SILU, grad_output)


def gelu_plan_or_why(self: Tensor, *, approximate: str) -> ElementwisePlan | str:
    act = _mode(approximate)
    return act if act.__class__ is str else why.elementwise(self) or plan_elementwise(self, act)


def gelu_backward_plan_or_why(grad_output: Tensor, self: Tensor, *, approximate: str) -> ElementwisePlan | str:
    act = _mode(approximate)
    return act if act.__class__ is str else why.elementwise(self, grad_output) or plan_elementwise(self, act, grad_output)


# An impl called alone plans from the layout itself, without the cond's checks.
def silu_impl(self: Tensor, plan: ElementwisePlan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(self, plan or plan_elementwise(self, _SILU))


def silu_backward_impl(grad_output: Tensor, self: Tensor, plan: ElementwisePlan | None = None) -> Tensor:
    return FAMILY.kernels().run_backward(grad_output, self, plan or plan_elementwise(self, _SILU, grad_output))


def gelu_impl(self: Tensor, *, approximate: str, plan: ElementwisePlan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(self, plan or plan_elementwise(self, _GELU_MODES[approximate]))


def gelu_backward_impl(grad_output: Tensor, self: Tensor, *, approximate: str,
                       plan: ElementwisePlan | None = None) -> Tensor:
    plan = plan or plan_elementwise(self, _GELU_MODES[approximate], grad_output)
    return FAMILY.kernels().run_backward(grad_output, self, plan)


def _op(op: str, plan_or_why: Callable, impl: Callable, key: tuple[str, ...], name: str, bench: tuple[str, ...]) -> Op:
    return Op(op, plan_or_why, impl, key, public_name=name, backward=op.endswith("_backward"), bench=bench)


FAMILY = Family(DSL_NAME, "activations", [
    _op("silu", silu_plan_or_why, silu_impl, ("self",), "silu", ("silu",)),
    _op("silu_backward", silu_backward_plan_or_why, silu_backward_impl, ("grad_output", "self"), "silu", ("silu",)),
    _op("gelu", gelu_plan_or_why, gelu_impl, ("self", "approximate"), "gelu", ("gelu", "gelu_tanh")),
    _op("gelu_backward", gelu_backward_plan_or_why, gelu_backward_impl, ("grad_output", "self", "approximate"),
        "gelu", ("gelu", "gelu_tanh")),
], kernels="activations")
