"""``_softmax``, ``_log_softmax`` and their ``_backward_data`` ops on the Triton row kernels.

The reduced dim must be the last one that is not of size 1; the other dims must collapse to one
strided row axis. ``half_to_float`` (fp16 in, fp32 out) only exists on CUDA, where aten supports
it for fp16 inputs; the same holds here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import torch

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.layout import float_dtype, reduced_rows
from python_native_dsls.spec import OverrideSpec, runtime_import

from ..plans.layout import on_backend, row_fits
from ..plans.rows import RowPlan, row_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import softmax

    return softmax


def _half_to_float_ok(x: Tensor) -> bool:
    return x.dtype == torch.float16 and x.device.type == "cuda"


def _forward_plan(self: Tensor, dim: int, half_to_float: bool) -> RowPlan | None:
    """The launch plan for a forward the kernels take, else None (metadata only)."""
    if not (on_backend(self) and float_dtype(self)):
        return None
    if half_to_float and not _half_to_float_ok(self):
        return None
    rows = reduced_rows(self, dim)
    if not row_fits(rows):
        return None
    out_dtype = torch.float32 if half_to_float else self.dtype
    return row_plan(rows, out_dtype, self.is_contiguous() and out_dtype == self.dtype)


def _backward_plan(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> RowPlan | None:
    if not (on_backend(grad_output, output) and float_dtype(output)):
        return None
    if grad_output.dtype != output.dtype or grad_output.shape != output.shape:
        return None
    # Either no conversion, or the backward of a half_to_float forward (fp32 grads, fp16 input).
    if input_dtype != output.dtype and not (
        output.dtype == torch.float32 and input_dtype == torch.float16 and output.device.type == "cuda"
    ):
        return None
    rows, grad_rows = reduced_rows(output, dim), reduced_rows(grad_output, dim)
    if not (row_fits(rows) and row_fits(grad_rows)):
        return None
    return row_plan(rows, input_dtype, output.is_contiguous() and input_dtype == output.dtype, grad_rows)


_FORWARD_PLANS: SpecializationCache[RowPlan | None] = SpecializationCache(_forward_plan, 4096)
_BACKWARD_PLANS: SpecializationCache[RowPlan | None] = SpecializationCache(_backward_plan, 4096)
_forward_lookup = _FORWARD_PLANS.lookup
_backward_lookup = _BACKWARD_PLANS.lookup


def forward_plan(self: Tensor, dim: int, half_to_float: bool) -> RowPlan | None:
    """The forward plan, cached per layout for real tensors (FakeTensors are planned directly)."""
    if self.__class__ is not Tensor:
        return _forward_plan(self, dim, half_to_float)
    key = (self.size(), self.stride(), self.dtype, self.is_cuda, self.is_cpu, dim, half_to_float)
    plan = _forward_lookup(key, MISSING)
    return _FORWARD_PLANS.get(key, self, dim, half_to_float) if plan is MISSING else plan


def backward_plan(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> RowPlan | None:
    if grad_output.__class__ is not Tensor or output.__class__ is not Tensor:
        return _backward_plan(grad_output, output, dim, input_dtype)
    key = (
        output.size(), output.stride(), output.dtype, output.is_cuda, output.is_cpu,
        grad_output.size(), grad_output.stride(), grad_output.dtype, grad_output.is_cuda, grad_output.is_cpu,
        dim, input_dtype,
    )
    plan = _backward_lookup(key, MISSING)
    return _BACKWARD_PLANS.get(key, grad_output, output, dim, input_dtype) if plan is MISSING else plan


def _impl_forward_plan(self: Tensor, dim: int, half_to_float: bool) -> RowPlan:
    """For an impl called without its cond's plan: the plan, or where the cond would decline (tests
    run the fp16-to-fp32 kernels on CPU this way) a plan from the layout alone."""
    plan = forward_plan(self, dim, half_to_float)
    if plan is None:
        out_dtype = torch.float32 if half_to_float else self.dtype
        plan = row_plan(reduced_rows(self, dim), out_dtype, False)
    return plan


def _impl_backward_plan(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> RowPlan:
    plan = backward_plan(grad_output, output, dim, input_dtype)
    if plan is None:
        plan = row_plan(reduced_rows(output, dim), input_dtype, False, reduced_rows(grad_output, dim))
    return plan


# The conds return their plan (None: declined); the router hands it to the impl as ``plan``.
softmax_cond = forward_plan
softmax_backward_cond = backward_plan


def softmax_impl(self: Tensor, dim: int, half_to_float: bool, plan: RowPlan | None = None) -> Tensor:
    return _kernels().run_forward(self, plan or _impl_forward_plan(self, dim, half_to_float), False)


def log_softmax_impl(self: Tensor, dim: int, half_to_float: bool, plan: RowPlan | None = None) -> Tensor:
    return _kernels().run_forward(self, plan or _impl_forward_plan(self, dim, half_to_float), True)


def softmax_backward_impl(
    grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype, plan: RowPlan | None = None
) -> Tensor:
    plan = plan or _impl_backward_plan(grad_output, output, dim, input_dtype)
    return _kernels().run_backward(grad_output, output, plan, False)


def log_softmax_backward_impl(
    grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype, plan: RowPlan | None = None
) -> Tensor:
    plan = plan or _impl_backward_plan(grad_output, output, dim, input_dtype)
    return _kernels().run_backward(grad_output, output, plan, True)


def softmax_explain(self: Tensor, dim: int, half_to_float: bool) -> str | None:
    """Why ``softmax_cond`` declined (asked by traced calls only)."""
    found = why.device(self) or why.dtype(self)
    if found:
        return found
    if half_to_float and not _half_to_float_ok(self):
        return "half_to_float needs a float16 CUDA input"
    return why.reduced(self, dim, reduced_rows(self, dim))


def softmax_backward_explain(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> str | None:
    """Why ``softmax_backward_cond`` declined."""
    found = why.device(grad_output, output) or why.dtype(output) or why.same(output, grad_output, "grad_output")
    if found:
        return found
    if input_dtype != output.dtype and not (
        output.dtype == torch.float32 and input_dtype == torch.float16 and output.device.type == "cuda"
    ):
        return f"input_dtype {why.name(input_dtype)} differs from the output's {why.name(output.dtype)}"
    return why.reduced(output, dim, reduced_rows(output, dim)) or why.rows(reduced_rows(grad_output, dim), "grad rows")


def _forward_variant(log: bool, path: str) -> Callable[..., Tensor]:
    """The forward impl that takes long rows (past the packed kernels' width) down ``path``."""

    def impl(self: Tensor, dim: int, half_to_float: bool, plan: RowPlan | None = None) -> Tensor:
        return _kernels().run_forward(self, plan or _impl_forward_plan(self, dim, half_to_float), log, path)

    impl.__name__ = impl.__qualname__ = f"{'log_' if log else ''}softmax_{path}_impl"
    return impl


def _backward_variant(log: bool, path: str) -> Callable[..., Tensor]:
    def impl(
        grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype, plan: RowPlan | None = None
    ) -> Tensor:
        plan = plan or _impl_backward_plan(grad_output, output, dim, input_dtype)
        return _kernels().run_backward(grad_output, output, plan, log, path)

    impl.__name__ = impl.__qualname__ = f"{'log_' if log else ''}softmax_backward_{path}_impl"
    return impl


# Long rows (vocabularies) have three paths (see ``kernels.softmax_long``); the default picks one by
# width, the variants pin one: "split" (slices across programs, two passes, no spills), "streamed"
# (one program per row, online max/sum).
_LONG_ROW_PATHS = ("split", "streamed")


def _variants(make: Callable[[bool, str], Callable[..., Tensor]], log: bool) -> dict[str, Callable[..., Tensor]]:
    return {path: make(log, path) for path in _LONG_ROW_PATHS}


OVERRIDES = [
    OverrideSpec.planned("_softmax", softmax_cond, softmax_impl, public_name="softmax", explain=softmax_explain,
                         replayable=True, variants=_variants(_forward_variant, False)),
    OverrideSpec.planned("_log_softmax", softmax_cond, log_softmax_impl, public_name="log_softmax",
                         explain=softmax_explain, replayable=True, variants=_variants(_forward_variant, True)),
    OverrideSpec.planned("_softmax_backward_data", softmax_backward_cond, softmax_backward_impl,
                         public_name="softmax", backward=True, explain=softmax_backward_explain, replayable=True,
                         variants=_variants(_backward_variant, False)),
    OverrideSpec.planned("_log_softmax_backward_data", softmax_backward_cond, log_softmax_backward_impl,
                         public_name="log_softmax", backward=True, explain=softmax_backward_explain, replayable=True,
                         variants=_variants(_backward_variant, True)),
]
