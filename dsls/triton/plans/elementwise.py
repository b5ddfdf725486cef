"""Launch plans of the pointwise kernels: one flat launch over dense operands, or tiles of rows
over row views (each operand with its own row stride, the last dim contiguous)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from python_native_dsls.layout import Rows, as_rows

from .layout import MAX_INDEX, dense_like
from .tiles import ELEMENTWISE_BLOCK, ELEMENTWISE_WARPS, cdiv, next_power_of_2

# Columns per program of the row kernels: blocks of a wide row (an MLP's 11008 or 14336 columns)
# waste at most a few percent in their last, masked block; short rows are packed to a full tile.
ROWS_BLOCK_N = 1024
_MAX_GRID_Y = 65535  # CUDA's limit on the second grid axis (column blocks)


class ElementwisePlan(NamedTuple):
    """One flat launch over ``n`` elements, worked out once per layout, dtype and activation."""

    n: int
    grid: tuple[int]
    act: int
    launch_key: tuple  # everything Triton specializes the launch on but pointer alignment


def plan_elementwise(x: torch.Tensor, act: int, grad: torch.Tensor | None = None) -> ElementwisePlan:
    """The launch over ``x`` (and ``grad``, for a backward), without checking that the kernel takes it."""
    n = x.numel()
    grad_dtype = None if grad is None else grad.dtype
    return ElementwisePlan(n, (cdiv(n, ELEMENTWISE_BLOCK),), act, (x.dtype, grad_dtype, n, act))


class RowsPlan(NamedTuple):
    """Tiles of ``block_m`` rows by ``block_n`` columns over row views of the operands."""

    n_rows: int
    n_cols: int
    strides: tuple[int, ...]  # each operand's row and column strides, in the order the op lists its operands
    gated: bool  # act(x) * up (the second operand), else act(x)
    act: int
    grid: tuple[int, int]
    block_m: int
    block_n: int
    num_warps: int
    launch_key: tuple


def unit_rows(t: torch.Tensor, unit: bool = True) -> Rows | None:
    """``t`` as rows of its last dim (its leading dims collapse to one row stride), or None;
    ``unit``: only with a contiguous last dim."""
    r = as_rows(t, 1)
    if r is None or r.n_rows == 0 or r.n_cols == 0 or (unit and r.col_stride != 1 and r.n_cols != 1):
        return None
    return r


def plan_rows(rows: Sequence[Rows], act: int, gated: bool, dtypes: tuple) -> RowsPlan | None:
    """The tiles over operands of one shape seen as ``rows`` (same row and column counts), or None
    where a column index or the grid would exceed the kernels' limits."""
    n_rows, n_cols = rows[0].n_rows, rows[0].n_cols
    if n_rows > MAX_INDEX:  # a program's first row, program_id * BLOCK_M, is int32 until widened
        return None
    if any(r.n_rows != n_rows or r.n_cols != n_cols or (n_cols - 1) * r.col_stride > MAX_INDEX for r in rows):
        return None
    # 32 bytes of each operand per thread: 16 elements of a 16-bit dtype, 8 of fp32 (the gated
    # backward holds five operands: at 16 fp32 elements a thread it needs 74 registers on sm_90a).
    per_thread = 8 if any(d.itemsize > 2 for d in dtypes) else 16
    tile = per_thread * 32 * ELEMENTWISE_WARPS
    block_n = min(next_power_of_2(n_cols), ROWS_BLOCK_N)
    block_m = min(max(1, tile // block_n), next_power_of_2(n_rows))
    grid = (cdiv(n_rows, block_m), cdiv(n_cols, block_n))
    if grid[1] > _MAX_GRID_Y:
        return None
    warps = max(1, min(ELEMENTWISE_WARPS, block_m * block_n // (32 * per_thread)))
    strides = tuple(s for r in rows for s in (r.row_stride, r.col_stride))
    key = (dtypes, n_rows, n_cols, strides, act, gated)
    return RowsPlan(n_rows, n_cols, strides, gated, act, grid, block_m, block_n, warps, key)


def pointwise_plan(x: torch.Tensor, act: int, unit: bool,
                   grad: torch.Tensor | None = None) -> ElementwisePlan | RowsPlan | None:
    """``act(x)`` (``grad * act'(x)`` for a backward): one flat launch where the operands share one
    dense layout, else tiles over their rows (``unit``: only rows with a contiguous last dim), else
    None. The layout alone decides: device, dtype and size are the family's checks (``why.elementwise``)."""
    operands = (x,) if grad is None else (x, grad)
    if dense_like(*operands):
        return plan_elementwise(x, act, grad)
    if grad is not None and grad.shape != x.shape:
        return None
    rows = tuple(unit_rows(t, unit) for t in operands)
    if any(r is None for r in rows):
        return None
    return plan_rows(rows, act, False, tuple(t.dtype for t in operands))
