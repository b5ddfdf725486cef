"""``bmm`` when the inner dimension is 1: a batched outer product, any input strides."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from python_native_dsls.family import Family, Op
from python_native_dsls.proving import FORWARD, BenchRow, Driver, Sample, Tensors, rand

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


def _cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    """What verify checks ``torch.bmm`` on: outer products, a K = 3 call the kernel declines, an empty
    batch, transposed operands and products near 1e4."""
    for name, (a_shape, b_shape) in {
        "outer product": ((3, 5, 1), (3, 1, 7)),
        "odd sizes": ((2, 17, 3), (2, 3, 9)),
        "empty batch": ((0, 4, 1), (0, 1, 4)),
    }.items():
        yield Sample(name, torch.bmm, [rand(*a_shape, dtype=dtype, device=device), rand(*b_shape, dtype=dtype, device=device)])
    a = rand(2, 1, 6, dtype=dtype, device=device).transpose(1, 2)
    b = rand(2, 5, 1, dtype=dtype, device=device).transpose(1, 2)
    yield Sample("transposed", torch.bmm, [a, b])
    yield Sample("1e4 scale", torch.bmm, [rand(2, 4, 1, dtype=dtype, device=device, scale=100.0),
                                          rand(2, 1, 4, dtype=dtype, device=device, scale=100.0)])


def _outer_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> Tensors:
    """A batch of column vectors ``x`` (bsz x m x 1) and of row vectors ``c`` (bsz x 1 x n)."""
    bsz, m, n = shape
    return {"x": torch.randn(bsz, m, 1, device=device, dtype=dtype),
            "c": torch.randn(bsz, 1, n, device=device, dtype=dtype), "leaves": [], "dy": None}


# Outer products (bsz, m, n), forward: the result written, the vectors read.
_OUTER_ROW = BenchRow("bmm_outer", ((2, 8, 16),), ((64, 1024, 1024), (256, 512, 512), (16, 4096, 4096)), _outer_inputs,
                      lambda t: torch.bmm(t["x"], t["c"]),
                      lambda shape, mode, itemsize: (shape[0] * (shape[1] * shape[2] + shape[1] + shape[2])) * itemsize,
                      modes=FORWARD)


FAMILY = Family(DSL_NAME, "bmm", [
    Op("bmm", bmm_plan_or_why, bmm_impl, ("self", "mat2"), public_name="bmm", bench_rows=(_OUTER_ROW,), replayable=True,
       verify=Driver(_cases, ("bmm",), ("bmm",))),
], kernels="bmm_outer")
