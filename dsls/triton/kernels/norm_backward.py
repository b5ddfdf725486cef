"""Layer norm and RMS norm backward: dx in one pass over the rows, dweight/dbias in a second stage.

Rows up to ``tuning.NORM_BWD_REGISTER_MAX`` wide are held whole in registers. A persistent grid
(a couple of programs per SM) gives each program one contiguous block of rows; it writes dx and
keeps its share of dw/db in fp32 registers, stored once as a row of a ``[programs, 2N]`` partial
buffer (dw in the first N columns, db in the next N). Traffic: x and dy read once, dx written
once, plus ``programs x N`` fp32 partials written and read back (L2-resident).

Wider rows are streamed. A first kernel reads x and dy once per row, in column chunks, to form
the two per-row sums the dx formula needs; a second walks column strips down blocks of rows,
reading x and dy again to write dx and accumulate that strip's dw/db in registers. Traffic:
x and dy read twice, dx written once.

Either way one column-parallel kernel folds the partial rows into dw/db.

``python_native::rms_norm`` keeps no statistics: its backward (``RSTD_FROM_X``) recomputes each
row's rstd from x, in registers on the one-pass path and in the row-sums pass when streaming
(which then stores it for the column strips). Its weight is shifted by an offset and, under the
Llama casting rule (``CAST_X``), rounded to its dtype, as is the normalized input the weight
gradient multiplies (see ``kernels.norm``).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from python_native.foundations.speckey import SpecializationCache
from python_native_dsls.layout import Rows

from ..plans.rows import RmsMode
from ..plans.tiles import cdiv, next_power_of_2
from . import tuning
from .alloc import new_contiguous
from .launch import Launcher, cast_out
from .norm_backward_tiles import (
    accumulate_dw_db,
    load_tiles,
    load_weight,
    row_rstd,
    row_stats,
    row_tile,
    store_dx,
    store_partials,
    xhat_and_grad,
    zero_partials,
)


@triton.jit
def _norm_bwd_rows_kernel(
    DY, X, W, MEAN, RSTD, DX, PART,
    n_rows, n_cols, rows_per_program, stride_dym, stride_dyn, stride_xm, stride_xn, eps, w_offset,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    CAST_X: tl.constexpr, RSTD_FROM_X: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = load_weight(W, cols, col_ok, w_offset, CAST_X) if HAS_W else None
    dw, db = zero_partials(BLOCK_N)

    for start in range(first, last, BLOCK_M):
        rows, row_ok, mask = row_tile(start, last, col_ok, BLOCK_M)
        x, dy = load_tiles(X, DY, rows, cols, mask, stride_xm, stride_xn, stride_dym, stride_dyn)
        if RSTD_FROM_X:
            rstd = row_rstd(x, n_cols, eps)
            mean = rstd
        else:
            mean, rstd = row_stats(MEAN, RSTD, rows, row_ok, IS_RMS)
        xhat, dy, g = xhat_and_grad(x, dy, w, mean, rstd, mask, IS_RMS, HAS_W)
        if NEED_DX:
            c1 = tl.sum(xhat * g, axis=1) / n_cols
            c2 = c1 if IS_RMS else tl.sum(g, axis=1) / n_cols
            store_dx(DX, rows, cols, mask, n_cols, xhat, g, rstd, c1, c2, IS_RMS)
        dw, db = accumulate_dw_db(dw, db, dy, xhat, X, CAST_X, NEED_DW, NEED_DB)
    store_partials(PART, pid, n_cols, cols, col_ok, dw, db, NEED_DW, NEED_DB)


@triton.jit
def _norm_bwd_row_sums_kernel(
    DY, X, W, MEAN, RSTD, C1, C2,
    n_rows, n_cols, stride_dym, stride_dyn, stride_xm, stride_xn, eps, w_offset,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, CAST_X: tl.constexpr, RSTD_FROM_X: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Per row: ``c1 = mean(xhat * g)`` and (layer norm) ``c2 = mean(g)``, streamed over columns;
    with ``RSTD_FROM_X``, the row's rstd too (stored for the column strips): ``c1`` is then summed
    as ``mean(x * g)`` and scaled by rstd at the end."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    if RSTD_FROM_X:  # RMS norm only: no mean
        rstd = tl.full([BLOCK_M], 1.0, tl.float32)
        mean = rstd
    else:
        mean, rstd = row_stats(MEAN, RSTD, rows, row_ok, IS_RMS)
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        mask = row_ok[:, None] & col_ok[None, :]
        x, dy = load_tiles(X, DY, rows, cols, mask, stride_xm, stride_xn, stride_dym, stride_dyn)
        w = load_weight(W, cols, col_ok, w_offset, CAST_X) if HAS_W else None
        xhat, dy, g = xhat_and_grad(x, dy, w, mean, rstd, mask, IS_RMS, HAS_W)
        acc1 += xhat * g
        if RSTD_FROM_X:
            acc2 += xhat * xhat
        elif not IS_RMS:
            acc2 += g
    c1 = tl.sum(acc1, axis=1) / n_cols
    if RSTD_FROM_X:
        rstd = tl.rsqrt(tl.sum(acc2, axis=1) / n_cols + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        c1 = c1 * rstd
    tl.store(C1 + rows, c1, mask=row_ok)
    if not IS_RMS:
        tl.store(C2 + rows, tl.sum(acc2, axis=1) / n_cols, mask=row_ok)


@triton.jit
def _norm_bwd_cols_kernel(
    DY, X, W, MEAN, RSTD, C1, C2, DX, PART,
    n_rows, n_cols, rows_per_program, stride_dym, stride_dyn, stride_xm, stride_xn, w_offset,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    CAST_X: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """A column strip (axis 0) down one block of rows (axis 1): dx, and the strip's dw/db partials."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    group = tl.program_id(1)
    first = group * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    w = load_weight(W, cols, col_ok, w_offset, CAST_X) if HAS_W else None
    dw, db = zero_partials(BLOCK_N)
    for start in range(first, last, BLOCK_M):
        rows, row_ok, mask = row_tile(start, last, col_ok, BLOCK_M)
        x, dy = load_tiles(X, DY, rows, cols, mask, stride_xm, stride_xn, stride_dym, stride_dyn)
        mean, rstd = row_stats(MEAN, RSTD, rows, row_ok, IS_RMS)
        xhat, dy, g = xhat_and_grad(x, dy, w, mean, rstd, mask, IS_RMS, HAS_W)
        if NEED_DX:
            c1 = tl.load(C1 + rows, mask=row_ok, other=0.0)
            c2 = c1 if IS_RMS else tl.load(C2 + rows, mask=row_ok, other=0.0)
            store_dx(DX, rows, cols, mask, n_cols, xhat, g, rstd, c1, c2, IS_RMS)
        dw, db = accumulate_dw_db(dw, db, dy, xhat, X, CAST_X, NEED_DW, NEED_DB)
    store_partials(PART, group, n_cols, cols, col_ok, dw, db, NEED_DW, NEED_DB)


@triton.jit
def _column_sum_kernel(PART, OUT, n_parts, part_stride, n_cols, col_offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``OUT[c] = sum_p PART[p, col_offset + c]`` over one strip of columns, ``BLOCK_M`` partial rows
    at a time, stored in ``OUT``'s dtype (the parameters')."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_M):
        parts = start + tl.arange(0, BLOCK_M)
        mask = (parts < n_parts)[:, None] & col_ok[None, :]
        ptrs = PART + parts.to(tl.int64)[:, None] * part_stride + col_offset + cols[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0)
    tl.store(OUT + cols, cast_out(tl.sum(acc, axis=0), OUT.dtype.element_ty), mask=col_ok)


_FLAGS = ("IS_RMS", "HAS_W", "NEED_DX", "NEED_DW", "NEED_DB", "CAST_X")
_OP = "native_layer_norm_backward, _fused_rms_norm_backward, python_native rms_norm_backward"
_ROWS = Launcher(_norm_bwd_rows_kernel, (*_FLAGS, "RSTD_FROM_X", "BLOCK_M", "BLOCK_N"), op=_OP)
_ROW_SUMS = Launcher(_norm_bwd_row_sums_kernel, ("IS_RMS", "HAS_W", "CAST_X", "RSTD_FROM_X", "BLOCK_M", "BLOCK_N"),
                     op=_OP)
_COLS = Launcher(_norm_bwd_cols_kernel, (*_FLAGS, "BLOCK_M", "BLOCK_N"), op=_OP)
_COLUMN_SUM = Launcher(_column_sum_kernel, ("BLOCK_M", "BLOCK_N"), fresh=("PART", "OUT"), op=_OP)


def _split_rows(n_rows: int, block_m: int, programs: int) -> tuple[int, int]:
    """``(programs, rows_per_program)``: contiguous row blocks, a multiple of ``block_m`` each."""
    blocks = cdiv(n_rows, block_m)
    per_program = cdiv(blocks, max(1, min(blocks, programs))) * block_m
    return cdiv(n_rows, per_program), per_program


class _Plan(NamedTuple):
    """Everything about a backward launch that follows from its specialization key, worked out once."""

    register_rows: bool  # rows fit the register tile: one pass; else row sums, then column strips
    grid: tuple[int, ...]
    programs: int  # partial rows of dw/db (row blocks)
    per_program: int
    num_warps: int
    block_m: int
    block_n: int
    sums_grid: tuple[int, ...]  # the row-sums pre-pass (wide rows only)
    sums: tuning.Tile | None
    reduce_grid: tuple[int, ...]  # the column sum folding the partial rows
    reduce: tuning.Tile | None
    reduce_width: int
    reduce_offset: int
    serial: int  # names the launch to the launchers: unique per plan, and a plan per specialization key


def _build_plan(m: int, n: int, dtype: torch.dtype, need: tuple[bool, bool, bool], slots: int,
                recompute: bool = False) -> _Plan:
    need_dx, need_dw, need_db = need
    reduce = need_dw or need_db
    width, offset = n * (need_dw + need_db), 0 if need_dw else n
    folding = tuning.tile("column_sum", torch.float32, width) if reduce else None
    reduce_grid = (cdiv(width, folding.block_n),) if folding is not None else ()
    if n <= tuning.NORM_BWD_REGISTER_MAX:
        cfg = tuning.tile("norm_bwd_rows", dtype, n)
        programs, per_program = _split_rows(m, cfg.block_m, slots if reduce else cdiv(m, cfg.block_m))
        return _Plan(True, (programs,), programs, per_program, cfg.num_warps, cfg.block_m, next_power_of_2(n),
                     (), None, reduce_grid, folding, width, offset, next(_serials))
    sums = tuning.tile("norm_bwd_row_sums", dtype, n) if need_dx or recompute else None
    cfg = tuning.tile("norm_bwd_cols", dtype, n)
    strips = cdiv(n, cfg.block_n)
    wanted = max(1, slots // strips) if reduce else cdiv(m, cfg.block_m)
    programs, per_program = _split_rows(m, cfg.block_m, wanted)
    sums_grid = (cdiv(m, sums.block_m),) if sums is not None else ()
    return _Plan(False, (strips, programs), programs, per_program, cfg.num_warps, cfg.block_m, cfg.block_n,
                 sums_grid, sums, reduce_grid, folding, width, offset, next(_serials))


_serials = itertools.count()
_PLANS: SpecializationCache[_Plan] = SpecializationCache(_build_plan, 4096)


def backward(
    dy: torch.Tensor,
    dy_rows: Rows,
    x: torch.Tensor,
    x_rows: Rows,
    mean: torch.Tensor | None,
    rstd: torch.Tensor | None,
    weight: torch.Tensor | None,
    need: tuple[bool, bool, bool],
    rms: bool,
    param_shape: tuple[int, ...] | None = None,
    mode: RmsMode | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients ``(dx, dw, db)``; entries not in ``need`` are None. ``mode``: the RMS norm of
    ``python_native::rms_norm`` (``rstd`` is then None: recomputed from x).

    Outputs are allocated in their final form, so no view or cast follows: ``dx`` contiguous in
    ``x``'s shape and dtype, ``dw`` / ``db`` shaped ``param_shape`` (default ``[N]``) in the
    weight's dtype (fp32 without a weight).
    """
    need_dx, need_dw, need_db = need
    if not (need_dx or need_dw or need_db):
        return None, None, None
    m, n = x_rows.n_rows, x_rows.n_cols
    slots = tuning.persistent_programs(x.get_device())
    w = x if weight is None else weight
    recompute = mode is not None
    if recompute:  # where the streamed path stores the recomputed rstd (the one-pass path never reads it)
        rstd = new_contiguous(x, (m,), torch.float32) if n > tuning.NORM_BWD_REGISTER_MAX else x
    stat = rstd if mean is None else mean
    # Everything a launch specializes on: layouts, dtypes, flags and the grid size.
    key = (dy_rows, x_rows, dy.dtype, x.dtype, w.dtype, stat.dtype, rstd.dtype, rms, weight is not None, need, slots,
           None if mode is None else mode.cast_x)
    plan = _PLANS.get(key, m, n, x.dtype, need, slots, recompute)
    dx = (torch.empty_like(x) if x.is_contiguous() else x.new_empty(x.shape)) if need_dx else None
    reduce = plan.reduce is not None
    # A single partial row is the gradient itself: written in the parameters' dtype, no fold.
    single = reduce and plan.programs == 1
    param_dtype = torch.float32 if weight is None else weight.dtype
    final = (n,) if param_shape is None else param_shape
    if single:  # laid out as one partial row [dw | db], allocated as the two outputs side by side
        part = new_contiguous(x, (2, *final), param_dtype)
    else:
        part = new_contiguous(x, (plan.programs, 2 * n), torch.float32) if reduce else rstd
    tensors = (dy, x, w, stat, rstd, x if dx is None else dx, part)
    _launch(plan, tensors, dy_rows, x_rows, need, rms, weight is not None, mode or _NO_MODE)
    if not reduce:
        return dx, None, None
    if single:
        return dx, part[0] if need_dw else None, part[1] if need_db else None
    return (dx, *_fold(plan, part, x, n, final, param_dtype, need_dw, need_db))


def _fold(plan, part: torch.Tensor, x: torch.Tensor, n: int, final: tuple[int, ...], param_dtype: torch.dtype,
          need_dw: bool, need_db: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dw, db)`` from the programs' partial rows; one launch covers both (side by side in each row)."""
    both = need_dw and need_db
    total = new_contiguous(x, (2, *final) if both else final, param_dtype)
    folding = plan.reduce
    _COLUMN_SUM.planned(
        (n, plan.programs, plan.reduce_width, plan.reduce_offset, total.dtype), plan.reduce_grid,
        (part, total, plan.programs, 2 * n, plan.reduce_width, plan.reduce_offset),
        folding.num_warps, folding.block_m, folding.block_n,
    )
    if both:
        return total[0], total[1]
    return (total, None) if need_dw else (None, total)


_NO_MODE = RmsMode(0.0, 0.0, False)


def _launch(plan: _Plan, tensors: tuple, dy_rows: Rows, x_rows: Rows, need: tuple[bool, bool, bool], rms: bool,
            has_w: bool, mode: RmsMode) -> None:
    """The dx / partial-sum launches of a plan: one pass over whole rows, or row sums then column strips."""
    dy, x, w, stat, rstd, out, part = tensors
    m, n = x_rows.n_rows, x_rows.n_cols
    strides = (dy_rows.row_stride, dy_rows.col_stride, x_rows.row_stride, x_rows.col_stride)
    recompute = mode is not _NO_MODE
    eps, offset = float(mode.eps), float(mode.offset)
    if plan.register_rows:
        _ROWS.planned(
            plan.serial, plan.grid, (dy, x, w, stat, rstd, out, part, m, n, plan.per_program, *strides, eps, offset),
            plan.num_warps, rms, has_w, *need, mode.cast_x, recompute, plan.block_m, plan.block_n,
        )
        return
    c1 = c2 = rstd
    if plan.sums is not None:
        sums = plan.sums
        c1 = new_contiguous(x, (m,), torch.float32)
        c2 = c1 if rms else new_contiguous(x, (m,), torch.float32)
        _ROW_SUMS(
            plan.sums_grid, (dy, x, w, stat, rstd, c1, c2, m, n, *strides, eps, offset),
            sums.num_warps, rms, has_w, mode.cast_x, recompute, sums.block_m, sums.block_n,
        )
    _COLS.planned(
        plan.serial, plan.grid, (dy, x, w, stat, rstd, c1, c2, out, part, m, n, plan.per_program, *strides, offset),
        plan.num_warps, rms, has_w, *need, mode.cast_x, plan.block_m, plan.block_n,
    )
