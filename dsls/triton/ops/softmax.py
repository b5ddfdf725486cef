"""``_softmax``, ``_log_softmax`` and their ``_backward_data`` ops on the Triton row kernels.

The reduced dim must be the last one that is not of size 1; the other dims must collapse to one
strided row axis. ``half_to_float`` (fp16 in, fp32 out) only exists on CUDA, where aten supports
it for fp16 inputs; the same holds here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native_dsls import bench_cases
from python_native_dsls.family import Family, Op
from python_native_dsls.layout import reduced_rows
from python_native_dsls.verify_cases import LOG_SOFTMAX, SOFTMAX

from ..plans.rows import RowPlan, row_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


def _half_to_float_ok(x: Tensor) -> bool:
    return x.dtype == torch.float16 and x.device.type == "cuda"


def forward_plan_or_why(self: Tensor, dim: int, half_to_float: bool) -> RowPlan | str:
    """The launch plan of a forward the kernels take, else why not (metadata only)."""
    found = why.device(self) or why.dtype(self)
    if found:
        return found
    if half_to_float and not _half_to_float_ok(self):
        return "half_to_float needs a float16 CUDA input"
    rows = reduced_rows(self, dim)
    found = why.reduced(self, dim, rows)
    if found:
        return found
    out_dtype = torch.float32 if half_to_float else self.dtype
    return row_plan(rows, out_dtype, self.is_contiguous() and out_dtype == self.dtype)


def backward_plan_or_why(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> RowPlan | str:
    found = why.device(grad_output, output) or why.dtype(output) or why.same(output, grad_output, "grad_output")
    if found:
        return found
    # Either no conversion, or the backward of a half_to_float forward (fp32 grads, fp16 input).
    if input_dtype != output.dtype and not (
        output.dtype == torch.float32 and input_dtype == torch.float16 and output.device.type == "cuda"
    ):
        return f"input_dtype {why.name(input_dtype)} differs from the output's {why.name(output.dtype)}"
    rows, grad_rows = reduced_rows(output, dim), reduced_rows(grad_output, dim)
    found = why.reduced(output, dim, rows) or why.rows(grad_rows, "grad rows")
    if found:
        return found
    return row_plan(rows, input_dtype, output.is_contiguous() and input_dtype == output.dtype, grad_rows)


def _forward(self: Tensor, dim: int, half_to_float: bool) -> RowPlan:
    """For an impl called without its cond's plan: the plan, or where the cond would decline (tests
    run the fp16-to-fp32 kernels on CPU this way) a plan from the layout alone."""
    plan = FAMILY["_softmax"].cond(self, dim, half_to_float)
    if plan is None:
        out_dtype = torch.float32 if half_to_float else self.dtype
        plan = row_plan(reduced_rows(self, dim), out_dtype, False)
    return plan


def _backward(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> RowPlan:
    plan = FAMILY["_softmax_backward_data"].cond(grad_output, output, dim, input_dtype)
    if plan is None:
        plan = row_plan(reduced_rows(output, dim), input_dtype, False, reduced_rows(grad_output, dim))
    return plan


def _forward_impl(log: bool, path: str = "auto") -> Callable[..., Tensor]:
    """The forward impl; ``path`` pins how long rows (past the packed kernels' width) run."""

    def impl(self: Tensor, dim: int, half_to_float: bool, plan: RowPlan | None = None) -> Tensor:
        return FAMILY.kernels().run_forward(self, plan or _forward(self, dim, half_to_float), log, path)

    impl.__name__ = impl.__qualname__ = f"{'log_' if log else ''}softmax_{'' if path == 'auto' else path + '_'}impl"
    return impl


def _backward_impl(log: bool, path: str = "auto") -> Callable[..., Tensor]:
    def impl(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype,
             plan: RowPlan | None = None) -> Tensor:
        plan = plan or _backward(grad_output, output, dim, input_dtype)
        return FAMILY.kernels().run_backward(grad_output, output, plan, log, path)

    impl.__name__ = impl.__qualname__ = f"{'log_' if log else ''}softmax_backward_{'' if path == 'auto' else path + '_'}impl"
    return impl


softmax_impl, log_softmax_impl = _forward_impl(False), _forward_impl(True)
softmax_backward_impl, log_softmax_backward_impl = _backward_impl(False), _backward_impl(True)

# Long rows (vocabularies) have three paths (see ``kernels.softmax_long``); the default picks one by
# width, the variants pin one: "split" (slices across programs, two passes, no spills), "streamed"
# (one program per row, online max/sum).
_LONG_ROW_PATHS = ("split", "streamed")


def _ops(name: str, log: bool) -> list[Op]:
    forward = Op(f"_{name}", forward_plan_or_why, _forward_impl(log), ("self", "dim", "half_to_float"),
                 public_name=name, variants={p: _forward_impl(log, p) for p in _LONG_ROW_PATHS}, replayable=True,
                 bench_rows=(bench_cases.LOG_SOFTMAX if log else bench_cases.SOFTMAX,),
                 verify=LOG_SOFTMAX if log else SOFTMAX)
    backward = Op(f"_{name}_backward_data", backward_plan_or_why, _backward_impl(log),
                  ("grad_output", "output", "dim", "input_dtype"), public_name=name, backward=True,
                  variants={p: _backward_impl(log, p) for p in _LONG_ROW_PATHS}, bench=(name,),
                  replayable=True)
    return [forward, backward]


FAMILY = Family(DSL_NAME, "softmax", [*_ops("softmax", False), *_ops("log_softmax", True)], kernels="softmax")
