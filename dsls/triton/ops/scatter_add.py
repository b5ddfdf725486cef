"""``scatter_add`` and ``index_add`` (functional, in-place; ``out=`` derived) on the atomic scatter-add kernel.

Accepted: float32, float16, bfloat16, float64, int32 and int64 on the backend's device, self,
index and source of aten's shapes for the op (``scatter_add``: int64 index of self's rank, no
larger than source, nor than self outside ``dim``; ``index_add``: 1-D int32/int64 index, source
shaped as self but along ``dim``), whose dims before and after ``dim`` each collapse to one
strided axis over the iteration space. In place: self dense (no internal overlap) and apart from
index and source in memory. ``index_add``'s alpha: any int or float for float types (float64:
one that float32 holds exactly), an int within the dtype for integer types.

Declined: other dtypes, 0-dim or empty inputs, mismatched dtypes or shapes (aten raises its own
errors), and float types under ``torch.use_deterministic_algorithms(True)``: atomics add in no
fixed order, so aten (whose deterministic path this respects) runs then. Integer sums are exact in
any order and stay on the kernel.

Half types add in a float32 copy of self, rounded once: at least as accurate as aten, whose kernels
round every addition. An index out of range raises aten's error (CUDA: an asynchronous device
assert, as aten's); in-range elements may have been added to an in-place self by then.
"""

from __future__ import annotations

import functools
import struct
from types import ModuleType
from typing import Any

import torch

from python_native.speckey import MISSING, SpecializationCache
from python_native_dsls.spec import OverrideSpec

from ..plans.layout import dense_like, on_backend
from ..plans.scatter import DTYPES, Axes, ScatterPlan, axes, contiguous_strides, scatter_plan, span

Tensor = torch.Tensor
_deterministic = torch.are_deterministic_algorithms_enabled


def _alpha(alpha: Any, dtype: torch.dtype) -> Any:
    """``alpha`` as the kernel scales by it (None: 1, no scaling), or MISSING to decline."""
    cls = alpha.__class__
    if dtype.is_floating_point:
        if cls is not int and cls is not float:
            return MISSING
        if alpha == 1:
            return None
        if dtype == torch.float64:  # the kernel's float argument is a float32
            try:
                if struct.unpack("f", struct.pack("f", alpha))[0] != alpha:
                    return MISSING
            except OverflowError:
                return MISSING
        return float(alpha)
    if cls is not int:
        return MISSING
    bits = 31 if dtype == torch.int32 else 63
    return None if alpha == 1 else alpha if -(2**bits) <= alpha < 2**bits else MISSING


def _finish(self: Tensor, dim: int, space: tuple[int, ...], index: Axes | None, source: Tensor,
            inplace: bool, alpha: Any, index_t: Tensor) -> ScatterPlan | None:
    """The plan over ``space`` once the op's own checks passed (None: declined)."""
    acc = torch.float32 if self.dtype in (torch.float16, torch.bfloat16) else self.dtype
    direct = inplace and acc == self.dtype  # adds straight into self
    if direct and not dense_like(self):
        return None
    out = axes(space, self.stride() if direct else contiguous_strides(self.shape), dim)
    src = axes(space, source.stride(), dim)
    if index is None or out is None or src is None:
        return None
    spans = tuple(span(t.shape, t.stride()) * t.element_size() for t in (self, index_t, source))
    return scatter_plan(space, dim, self.shape[dim], index, src, out, self.dtype, alpha, spans)


def _common(self: Any, dim: int, index: Any, source: Any) -> int | None:
    """``dim`` wrapped where the three are tensors the kernel could take; else None."""
    if not (isinstance(index, Tensor) and isinstance(source, Tensor) and on_backend(self, index, source)):
        return None
    n = self.ndim
    if self.dtype not in DTYPES or source.dtype != self.dtype or n == 0 or source.ndim != n or not -n <= dim < n:
        return None
    return dim % n


def _scatter_plan(self: Tensor, dim: int, index: Tensor, src: Tensor, inplace: bool) -> ScatterPlan | None:
    dim = _common(self, dim, index, src)
    if dim is None or index.dtype != torch.int64 or index.ndim != self.ndim:
        return None
    space = tuple(index.shape)
    for d, size in enumerate(space):
        if size > src.shape[d] or (d != dim and size > self.shape[d]):
            return None
    return _finish(self, dim, space, axes(space, index.stride(), dim), src, inplace, None, index)


def _index_plan(self: Tensor, dim: int, index: Tensor, source: Tensor, inplace: bool, alpha: Any) -> ScatterPlan | None:
    dim = _common(self, dim, index, source)
    if dim is None or index.dtype not in (torch.int32, torch.int64) or index.ndim != 1:
        return None
    if source.shape[dim] != index.shape[0] or any(
        a != b for d, (a, b) in enumerate(zip(self.shape, source.shape, strict=True)) if d != dim
    ):
        return None
    alpha = _alpha(alpha, self.dtype)
    if alpha is MISSING:
        return None
    space = tuple(source.shape)
    return _finish(self, dim, space, Axes(0, index.stride(0), 0), source, inplace, alpha, index)


_SCATTER: SpecializationCache[ScatterPlan | None] = SpecializationCache(_scatter_plan, 4096)
_INDEX: SpecializationCache[ScatterPlan | None] = SpecializationCache(_index_plan, 4096)


def _key(self: Tensor, dim: int, index: Tensor, source: Tensor, inplace: bool) -> tuple:
    return (self.size(), self.stride(), self.dtype, self.is_cuda, self.is_cpu, dim, inplace,
            index.size(), index.stride(), index.dtype, index.is_cuda, index.is_cpu,
            source.size(), source.stride(), source.dtype, source.is_cuda, source.is_cpu)


def _exact(*tensors: Any) -> bool:
    return all(t.__class__ is Tensor for t in tensors)


def _apart(self: Tensor, index: Tensor, source: Tensor, plan: ScatterPlan | None) -> ScatterPlan | None:
    """``plan`` where self's memory overlaps neither index's nor source's (in-place calls), else None
    (also for tensor subclasses, FakeTensors among them, whose memory cannot be told)."""
    if plan is None or not _exact(self, index, source):
        return None
    start = self.data_ptr()
    end = start + plan.spans[0]
    for t, length in ((index, plan.spans[1]), (source, plan.spans[2])):
        other = t.data_ptr()
        if other < end and start < other + length:
            return None
    return plan


def scatter_plan_for(self: Tensor, dim: int, index: Tensor, src: Tensor, inplace: bool = False) -> ScatterPlan | None:
    """The plan of a ``scatter_add`` call (cached per layout), or None to decline."""
    if self.dtype.is_floating_point and _deterministic():
        return None
    if not _exact(self, index, src):
        return _scatter_plan(self, dim, index, src, inplace)
    return _SCATTER.get(_key(self, dim, index, src, inplace), self, dim, index, src, inplace)


def index_plan_for(self: Tensor, dim: int, index: Tensor, source: Tensor, alpha: Any,
                   inplace: bool = False) -> ScatterPlan | None:
    """The plan of an ``index_add`` call (cached per layout and alpha), or None to decline."""
    if self.dtype.is_floating_point and _deterministic():
        return None
    if not _exact(self, index, source):
        return _index_plan(self, dim, index, source, inplace, alpha)
    key = (*_key(self, dim, index, source, inplace), alpha.__class__, alpha)
    return _INDEX.get(key, self, dim, index, source, inplace, alpha)


def scatter_add_cond(self: Tensor, dim: int, index: Tensor, src: Tensor) -> ScatterPlan | None:
    return scatter_plan_for(self, dim, index, src)


def scatter_add__cond(self: Tensor, dim: int, index: Tensor, src: Tensor) -> ScatterPlan | None:
    return _apart(self, index, src, scatter_plan_for(self, dim, index, src, True))


def index_add_cond(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any) -> ScatterPlan | None:
    return index_plan_for(self, dim, index, source, alpha)


def index_add__cond(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any) -> ScatterPlan | None:
    return _apart(self, index, source, index_plan_for(self, dim, index, source, alpha, True))


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import scatter_add

    return scatter_add


def _check_bounds(status: Tensor, self: Tensor, dim: int, index: Tensor, plan: ScatterPlan, scatter: bool) -> None:
    """Raise what aten raises for an index out of range: on CUDA an asynchronous device assert;
    on CPU its kernels' own error, which for ``index_add`` depends on the path aten takes (its
    scatter path for int64 indices, alpha 1 and more than one dim; a per-slice check otherwise)."""
    size = self.shape[dim]
    if status.is_cuda:
        torch._assert_async(status[0], f"index out of bounds for dimension {dim} with size {size}")
    elif not status[0]:
        if scatter or (self.ndim > 1 and index.dtype == torch.int64 and plan.alpha is None):
            raise RuntimeError(f"index {int(status[1])} is out of bounds for dimension {dim} with size {size}")
        raise IndexError("index out of range in self")


def _run(self: Tensor, dim: int, index: Tensor, source: Tensor, plan: ScatterPlan | None, inplace: bool,
         scatter: bool) -> Tensor:
    if plan is None:
        raise ValueError(f"scatter/index add: the Triton kernel does not take these inputs (self {self.dtype} "
                         f"{tuple(self.shape)}, dim {dim}, index {index.dtype} {tuple(index.shape)}, source "
                         f"{source.dtype} {tuple(source.shape)}); see the module's docstring")
    dim %= self.ndim
    if inplace and plan.acc_dtype == self.dtype:
        _check_bounds(_kernels().scatter_add_into(self, index, source, plan), self, dim, index, plan, scatter)
        return self
    out = self.to(plan.acc_dtype, memory_format=torch.contiguous_format, copy=True)
    _check_bounds(_kernels().scatter_add_into(out, index, source, plan), self, dim, index, plan, scatter)
    if inplace:
        return self.copy_(out)
    return out if out.dtype == self.dtype else out.to(self.dtype)


def scatter_add_impl(self: Tensor, dim: int, index: Tensor, src: Tensor, plan: ScatterPlan | None = None) -> Tensor:
    return _run(self, dim, index, src, plan or scatter_plan_for(self, dim, index, src), False, True)


def scatter_add__impl(self: Tensor, dim: int, index: Tensor, src: Tensor, plan: ScatterPlan | None = None) -> Tensor:
    return _run(self, dim, index, src, plan or scatter_add__cond(self, dim, index, src), True, True)


def index_add_impl(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any,
                   plan: ScatterPlan | None = None) -> Tensor:
    return _run(self, dim, index, source, plan or index_plan_for(self, dim, index, source, alpha), False, False)


def index_add__impl(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any,
                    plan: ScatterPlan | None = None) -> Tensor:
    return _run(self, dim, index, source, plan or index_add__cond(self, dim, index, source, alpha=alpha), True,
                False)


# The functional ops derive their out= forms (the result copied into out); the in-place ones add
# straight into self, which a derived variant could not (it would add into a copy, then copy back).
OVERRIDES = [
    OverrideSpec.planned("scatter_add", scatter_add_cond, scatter_add_impl, measured=False, derive_variants=("out",)),
    OverrideSpec.planned("scatter_add_", scatter_add__cond, scatter_add__impl, measured=False),
    OverrideSpec.planned("index_add", index_add_cond, index_add_impl, measured=False, derive_variants=("out",)),
    OverrideSpec.planned("index_add_", index_add__cond, index_add__impl, measured=False),
]
