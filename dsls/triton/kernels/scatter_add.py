"""Scatter-add with atomics: ``out[.., index[p], ..] += alpha * source[p]`` over an iteration space.

One program adds a tile of ``BLOCK_R`` (outer, dim) rows by ``BLOCK_I`` inner columns. The order of
the additions into one output element is the order the atomics land in: for floats the sum can
round differently from run to run, which is why the ops decline under
``torch.use_deterministic_algorithms(True)``; for integers it is exact.

An index outside ``[0, size)`` is never written through; the kernel records it in a status tensor
for the op to raise aten's error.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.scatter import ScatterPlan
from .launch import Launcher


@triton.jit
def _scatter_add_kernel(
    OUT, INDEX, SRC, STATUS, n_rows, dim_size, inner, target_size,
    i_outer, i_dim, i_inner, s_outer, s_dim, s_inner, o_outer, o_dim, o_inner, alpha,
    INDEX_ROW: tl.constexpr, SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)).to(tl.int64)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < inner)[None, :]
    outer = rows // dim_size
    d = rows % dim_size
    if INDEX_ROW:  # one index per row (index_add, expanded indices): one load per row
        idx = tl.load(INDEX + outer * i_outer + d * i_dim, mask=row_ok, other=0).to(tl.int64)[:, None]
    else:
        at = (outer * i_outer + d * i_dim)[:, None] + cols[None, :] * i_inner
        idx = tl.load(INDEX + at, mask=mask, other=0).to(tl.int64)
    inside = (idx >= 0) & (idx < target_size)
    bad = mask & ~inside
    nowhere = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.int32)
    tl.store(STATUS + nowhere, tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.int64), mask=bad)
    tl.store(STATUS + 1 + nowhere, idx + nowhere, mask=bad)
    value = tl.load(SRC + (outer * s_outer + d * s_dim)[:, None] + cols[None, :] * s_inner, mask=mask, other=0)
    value = value.to(OUT.dtype.element_ty)
    if SCALE:
        value = value * alpha
    target = OUT + (outer * o_outer)[:, None] + idx * o_dim + cols[None, :] * o_inner
    tl.atomic_add(target, value, mask=mask & inside, sem="relaxed")


SCATTER_ADD = Launcher(_scatter_add_kernel, ("INDEX_ROW", "SCALE", "BLOCK_R", "BLOCK_I"), fresh=("STATUS",))


def scatter_add_into(out: torch.Tensor, index: torch.Tensor, source: torch.Tensor, plan: ScatterPlan) -> torch.Tensor:
    """Add ``source`` (times the plan's alpha) into ``out`` (of the plan's accumulation dtype and
    output strides) at ``index``. Returns the status: ``[1, _]`` when every index was in range,
    else ``[0, one of those that were not]``."""
    status = torch.ones(2, dtype=torch.int64, device=out.device)
    alpha = 1 if plan.alpha is None else plan.alpha
    SCATTER_ADD.planned(
        plan.serial, plan.grid,
        (out, index, source, status, plan.n_rows, plan.dim_size, plan.inner, plan.target_size,
         *plan.index, *plan.source, *plan.out, alpha),
        plan.num_warps, plan.index_row, plan.alpha is not None, plan.block_r, plan.block_i,
    )
    return status
