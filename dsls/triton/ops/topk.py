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

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.spec import OverrideSpec

from ..plans.select import TopkPlan, rows_along, topk_plan
from . import why

Tensor = torch.Tensor


# The cond's checks, once: ``_plan`` (behind the plan cache) declines exactly where this gives a
# reason, and the traced explanation (``topk_explain``) reports that reason.
def _plan_or_why(self: Tensor, k: int, dim: int, largest: bool) -> TopkPlan | str:
    """The launch plan where the kernels take the call, else why not (metadata only)."""
    found = why.device(self) or why.dtype(self)
    if found:
        return found
    if self.ndim == 0:
        return "a 0-d input"
    if not -self.ndim <= dim < self.ndim:
        return f"dim {dim} is out of range for a {self.ndim}-d input"
    dim %= self.ndim
    shape = tuple(self.shape)
    rows = rows_along(shape, tuple(self.stride()), dim)
    if rows is None:
        return f"layout: the dims before dim {dim} or those after it do not collapse to one strided axis"
    return topk_plan(rows, k, bool(largest), shape[:dim] + (k,) + shape[dim + 1 :])


def _plan(self: Tensor, k: int, dim: int, largest: bool) -> TopkPlan | None:
    """The launch plan where the kernels take the call, else None."""
    plan = _plan_or_why(self, k, dim, largest)
    return None if plan.__class__ is str else plan


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


def topk_explain(self: Tensor, k: int, dim: int, largest: bool, _sorted: bool) -> str | None:
    """Why ``topk_cond`` declined (asked by traced calls only)."""
    if k.__class__ is not int:
        return f"k is a {k.__class__.__name__} (the kernels take a plain int k)"
    found = _plan_or_why(self, k, dim, largest)
    return found if found.__class__ is str else None


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
    OverrideSpec.planned("topk", topk_cond, topk_impl, measured=False, derive_variants=("out",),
                         explain=topk_explain),
]
