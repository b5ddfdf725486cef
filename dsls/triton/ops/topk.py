"""``topk`` (and its ``out=`` form ``topk.values``, derived) on the Triton top-k kernels.

What the override guarantees, against aten's contract:

- values equal aten's, in aten's order when ``sorted=True`` (largest or smallest first); NaN ranks
  above +inf, as in aten, so it comes first for ``largest=True`` and last for ``largest=False``;
- indices are int64 and name elements holding those values. Among equal values (ties, NaNs, -0.0
  and 0.0, which compare equal) aten's kernels pick any; these pick the lowest index first, so
  index and gradient placement can differ from aten's exactly where aten leaves it open;
- ``sorted=False`` returns the same sorted order: torch promises no order then.

Accepted: float32/float16/bfloat16 on the backend's device, ``1 <= k <= min(size, K_MAX)`` (1024),
a dim whose leading and trailing dims each collapse to one strided axis (any dim of a contiguous
tensor, transposed and sliced rows). Declined: other dtypes, 0-dim and empty inputs, larger k,
SymInt k, layouts that do not collapse.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.speckey import MISSING, SpecializationCache
from python_native_dsls.layout import float_dtype
from python_native_dsls.spec import OverrideSpec

from ..plans.layout import on_backend
from ..plans.select import TopkPlan, rows_along, topk_plan

Tensor = torch.Tensor


def _plan(self: Tensor, k: int, dim: int, largest: bool) -> TopkPlan | None:
    """The launch plan where the kernels take the call, else None (metadata only)."""
    if not (on_backend(self) and float_dtype(self)) or self.ndim == 0 or not -self.ndim <= dim < self.ndim:
        return None
    dim %= self.ndim
    shape = tuple(self.shape)
    rows = rows_along(shape, tuple(self.stride()), dim)
    if rows is None:
        return None
    return topk_plan(rows, k, bool(largest), shape[:dim] + (k,) + shape[dim + 1 :])


_PLANS: SpecializationCache[TopkPlan | None] = SpecializationCache(_plan, 4096)
_lookup = _PLANS.lookup


def topk_cond(self: Tensor, k: int, dim: int, largest: bool, _sorted: bool) -> TopkPlan | None:
    """The plan (cached per layout, k, dim and direction), or None to decline."""
    if k.__class__ is not int:  # a SymInt while tracing
        return None
    if self.__class__ is not Tensor:
        return _plan(self, k, dim, largest)
    key = (self.size(), self.stride(), self.dtype, self.is_cuda, self.is_cpu, k, dim, largest)
    plan = _lookup(key, MISSING)
    return _PLANS.get(key, self, k, dim, largest) if plan is MISSING else plan


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import topk

    return topk


def topk_impl(self: Tensor, k: int, dim: int, largest: bool, _sorted: bool,
              plan: TopkPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or topk_cond(self, k, dim, largest, _sorted)
    if plan is None:
        raise ValueError(f"topk: the Triton kernels do not take k={k}, dim={dim} for a {self.dtype} tensor of "
                         f"shape {tuple(self.shape)} and strides {self.stride()} (see the module's docstring)")
    return _kernels().run_topk(self, plan)


OVERRIDES = [
    OverrideSpec.planned("topk", topk_cond, topk_impl, measured=False, derive_variants=("out",)),
]
