"""``bmm`` when the inner dimension is 1: a batched outer product, any input strides."""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.layout import float_dtype
from python_native_dsls.spec import OverrideSpec, runtime_import

from ..plans.layout import MAX_INDEX, on_backend
from ..plans.outer import OuterPlan, plan_outer
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


def _outer_plan(self: Tensor, mat2: Tensor) -> OuterPlan | None:
    if not (on_backend(self, mat2) and float_dtype(self) and mat2.dtype == self.dtype):
        return None
    if self.ndim != 3 or mat2.ndim != 3 or self.shape[2] != 1 or mat2.shape[1] != 1:
        return None
    batch, m, n = self.shape[0], self.shape[1], mat2.shape[2]
    # The flat program grid is int32.
    if not (mat2.shape[0] == batch and batch > 0 and m > 0 and n > 0 and batch * m <= MAX_INDEX and n <= MAX_INDEX):
        return None
    return plan_outer(self, mat2)


_PLANS: SpecializationCache[OuterPlan | None] = SpecializationCache(_outer_plan, 4096)
_lookup = _PLANS.lookup


def outer_plan(self: Tensor, mat2: Tensor) -> OuterPlan | None:
    """The launch plan when the kernel takes ``self @ mat2``, else None; cached per layout for real tensors."""
    if self.__class__ is not Tensor or mat2.__class__ is not Tensor:
        return _outer_plan(self, mat2)
    key = (self.size(), self.stride(), self.dtype, self.is_cuda, self.is_cpu,
           mat2.size(), mat2.stride(), mat2.dtype, mat2.is_cuda, mat2.is_cpu)
    plan = _lookup(key, MISSING)
    return _PLANS.get(key, self, mat2) if plan is MISSING else plan


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import bmm_outer

    return bmm_outer


# The cond returns its plan (None: declined); the router hands it to the impl as ``plan``.
bmm_cond = outer_plan


def bmm_impl(self: Tensor, mat2: Tensor, plan: OuterPlan | None = None) -> Tensor:
    # An impl called directly where the cond would decline plans from the shapes.
    plan = plan or outer_plan(self, mat2) or plan_outer(self, mat2)
    return _kernels().run_outer(self, mat2, plan)


def bmm_explain(self: Tensor, mat2: Tensor) -> str | None:
    """Why ``bmm_cond`` declined (asked by traced calls only)."""
    found = why.device(self, mat2) or why.dtype(self)
    if found:
        return found
    if mat2.dtype != self.dtype:
        return f"mat2 dtype {why.name(mat2.dtype)} differs from self's {why.name(self.dtype)}"
    if self.ndim != 3 or mat2.ndim != 3:
        return f"not 3-d batches: {self.ndim}-d @ {mat2.ndim}-d"
    if self.shape[2] != 1 or mat2.shape[1] != 1:
        return f"not an outer product: inner dimension K = {self.shape[2]} > 1 (only K = 1 has a kernel)"
    if mat2.shape[0] != self.shape[0] or 0 in (self.shape[0], self.shape[1], mat2.shape[2]):
        return "empty or mismatched batches"
    return "too large: the flat program grid is int32"


OVERRIDES = [OverrideSpec.planned("bmm", bmm_cond, bmm_impl, public_name="bmm", explain=bmm_explain, replayable=True)]
