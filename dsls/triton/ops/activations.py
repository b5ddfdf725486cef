"""``silu``, ``gelu`` (``approximate`` 'none' or 'tanh') and their backward ops.

Dense layouts (contiguous, channels-last, permuted) with every operand sharing shape and strides
run as one flat launch that keeps the input's layout. Row views with a contiguous last dim (the
halves of ``gate_up.chunk(2, -1)``, row slices, each operand at its own row stride) run as tiles
of rows into a contiguous result, as aten lays out such results; other layouts go to aten. The
in-place and ``out=`` variants copy that result into their target.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from python_native_dsls.bench_cases import FULL_ROWS, IO_BYTES, QUICK_ROWS
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import FORWARD, BenchRow, Driver, x_input
from python_native_dsls.verify_cases import finite

from ..plans.elementwise import ElementwisePlan, RowsPlan, plan_elementwise, pointwise_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
Plan = ElementwisePlan | RowsPlan

_GELU_MODES = {"none": 1, "tanh": 2}  # values match python_native_dsls.triton.kernels.activations
_SILU = 0


def pointwise_plan_or_why(act: int, x: Tensor, grad: Tensor | None = None, unit: bool = True) -> Plan | str:
    """``act(x)`` (``grad * act'(x)`` for a backward): one flat launch over dense operands, else
    tiles over their rows (``unit``: only rows with a contiguous last dim), else why not."""
    found = why.elementwise(x, *(() if grad is None else (grad,)), rows="unit" if unit else "any")
    if found:
        return found
    return pointwise_plan(x, act, unit, grad) or "rows too wide for the kernels' grid"


def planned_anyway(act: int, x: Tensor, grad: Tensor | None = None, unit: bool = True) -> Plan:
    """For an impl called without its cond's plan: the plan, or one flat launch over the layout as it is."""
    return pointwise_plan(x, act, unit, grad) or plan_elementwise(x, act, grad)


def _mode(approximate: str) -> int | str:
    """The kernels' code of a GELU ``approximate``, else why not."""
    return _GELU_MODES.get(approximate, f"approximate={approximate!r} (takes 'none' or 'tanh')")


def silu_plan_or_why(self: Tensor) -> Plan | str:
    return pointwise_plan_or_why(_SILU, self)


def silu_backward_plan_or_why(grad_output: Tensor, self: Tensor) -> Plan | str:
    return pointwise_plan_or_why(_SILU, self, grad_output)


def gelu_plan_or_why(self: Tensor, *, approximate: str) -> Plan | str:
    act = _mode(approximate)
    return act if act.__class__ is str else pointwise_plan_or_why(act, self)


def gelu_backward_plan_or_why(grad_output: Tensor, self: Tensor, *, approximate: str) -> Plan | str:
    act = _mode(approximate)
    return act if act.__class__ is str else pointwise_plan_or_why(act, self, grad_output)


def silu_impl(self: Tensor, plan: Plan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(self, plan or planned_anyway(_SILU, self))


def silu_backward_impl(grad_output: Tensor, self: Tensor, plan: Plan | None = None) -> Tensor:
    return FAMILY.kernels().run_backward(grad_output, self, plan or planned_anyway(_SILU, self, grad_output))


def gelu_impl(self: Tensor, *, approximate: str, plan: Plan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(self, plan or planned_anyway(_GELU_MODES[approximate], self))


def gelu_backward_impl(grad_output: Tensor, self: Tensor, *, approximate: str, plan: Plan | None = None) -> Tensor:
    plan = plan or planned_anyway(_GELU_MODES[approximate], self, grad_output)
    return FAMILY.kernels().run_backward(grad_output, self, plan)


# What verify checks the forwards on: the awkward rows of the row-wise ops, -inf rows left out.
_SILU_CASES = Driver(finite(lambda x: (F.silu, [x])), ("nn.functional.silu",), ("silu_backward",))
_GELU_CASES = Driver(finite(lambda x: (lambda t: F.gelu(t, approximate="tanh"), [x])), ("nn.functional.gelu",),
                     ("gelu_backward",))
# What bench times, on the row grid: silu forward and backward, gelu's two approximations forward.
_SILU_ROW = BenchRow("silu", QUICK_ROWS, FULL_ROWS, x_input(), lambda t: F.silu(t["x"]), IO_BYTES)
_GELU_ROWS = (BenchRow("gelu", QUICK_ROWS, FULL_ROWS, x_input(), lambda t: F.gelu(t["x"]), IO_BYTES, modes=FORWARD),
              BenchRow("gelu_tanh", QUICK_ROWS, FULL_ROWS, x_input(), lambda t: F.gelu(t["x"], approximate="tanh"),
                       IO_BYTES, modes=FORWARD))


def _op(op: str, plan_or_why: Callable, impl: Callable, key: tuple[str, ...], name: str, bench: tuple[str, ...],
        verify: Driver | None = None, rows: tuple[BenchRow, ...] = ()) -> Op:
    return Op(op, plan_or_why, impl, key, public_name=name, backward=op.endswith("_backward"), bench=bench,
              verify=verify, bench_rows=rows)


FAMILY = Family(DSL_NAME, "activations", [
    _op("silu", silu_plan_or_why, silu_impl, ("self",), "silu", ("silu",), _SILU_CASES, (_SILU_ROW,)),
    _op("silu_backward", silu_backward_plan_or_why, silu_backward_impl, ("grad_output", "self"), "silu", ("silu",)),
    _op("gelu", gelu_plan_or_why, gelu_impl, ("self", "approximate"), "gelu", ("gelu", "gelu_tanh"), _GELU_CASES,
        _GELU_ROWS),
    _op("gelu_backward", gelu_backward_plan_or_why, gelu_backward_impl, ("grad_output", "self", "approximate"),
        "gelu", ("gelu", "gelu_tanh")),
], kernels="activations")
