"""``bmm`` when the inner dimension is 1: a batched outer product, any input strides."""

from __future__ import annotations

import torch

from python_native_dsls.family import Family, Op

from ..plans.layout import MAX_INDEX
from ..plans.outer import OuterPlan, plan_outer
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


def bmm_plan_or_why(self: Tensor, mat2: Tensor) -> OuterPlan | str:
    """The launch plan when the kernel takes ``self @ mat2``, else why not (metadata only)."""
    found = why.device(self, mat2) or why.dtype(self)
    if found:
        return found
    if mat2.dtype != self.dtype:
        return f"mat2 dtype {why.name(mat2.dtype)} differs from self's {why.name(self.dtype)}"
    if self.ndim != 3 or mat2.ndim != 3:
        return f"not 3-d batches: {self.ndim}-d @ {mat2.ndim}-d"
    if self.shape[2] != 1 or mat2.shape[1] != 1:
        return f"not an outer product: inner dimension K = {self.shape[2]} > 1 (only K = 1 has a kernel)"
    batch, m, n = self.shape[0], self.shape[1], mat2.shape[2]
    if mat2.shape[0] != batch or 0 in (batch, m, n):
        return "empty or mismatched batches"
    if batch * m > MAX_INDEX or n > MAX_INDEX:  # the flat program grid is int32
        return "too large: the flat program grid is int32"
    plan = plan_outer(self, mat2)
    if plan.grid[0] > MAX_INDEX:  # program ids and the tiles of a batch, tiles_m * tiles_n, are int32
        return f"too large: {plan.grid[0]} programs exceed the flat program grid's int32 ids (at most {MAX_INDEX})"
    return plan


def bmm_impl(self: Tensor, mat2: Tensor, plan: OuterPlan | None = None) -> Tensor:
    # An impl called directly where the cond would decline plans from the shapes.
    plan = plan or FAMILY["bmm"].cond(self, mat2) or plan_outer(self, mat2)
    return FAMILY.kernels().run_outer(self, mat2, plan)


FAMILY = Family(DSL_NAME, "bmm", [
    Op("bmm", bmm_plan_or_why, bmm_impl, ("self", "mat2"), public_name="bmm", bench=("bmm_outer",), replayable=True),
], kernels="bmm_outer")
