"""Reductions over one dim: sum, mean, prod, max and min, with the index of the chosen element.

Two kernels share the per-element steps below: ``_rows_kernel`` (the reduced axis is a row; short
rows are packed several per program) and ``_cols_kernel`` (a tile of inner columns walks down the
reduced axis). Each lane keeps its own accumulator over the steps, and the lanes are combined at
the end. Sums and products accumulate in fp32 (fp64 for fp64, int64 for integers, which wrap as
aten's do); max and min compare in the same types, which hold every input value exactly.

NaN and ties follow aten: a NaN wins every comparison (max and min return it, argmax and argmin its
first index) and among equal values the first index wins. ``_better`` is that order for the lanes
(and for the partial slices of the split path, ``plans.reduce``, merged as lanes are), and the
final combine keeps it: the lanes' extreme, then the smallest index holding it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.reduce import MAX, MEAN, MIN, PROD, SUM, ReducePlan
from .launch import Launcher, cast_out

# An index no element has: masked lanes carry it, so they never win a tie.
_NO_INDEX = tl.constexpr(2**62)
_SUM, _MEAN, _PROD, _MAX, _MIN = (tl.constexpr(code) for code in (SUM, MEAN, PROD, MAX, MIN))

TL_DTYPES = {
    torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32, torch.float64: tl.float64,
    torch.int64: tl.int64, None: None,
}


@triton.jit
def _neutral(OP: tl.constexpr, ACC: tl.constexpr):
    if OP == _PROD:
        value = 1
    elif OP == _MAX:
        if ACC.is_floating():
            value = float("-inf")
        else:
            value = -9223372036854775807 - 1
    elif OP == _MIN:
        if ACC.is_floating():
            value = float("inf")
        else:
            value = 9223372036854775807
    else:
        value = 0
    return value


@triton.jit
def _better(a, ia, b, ib, OP: tl.constexpr):
    """Where ``(a, ia)`` beats ``(b, ib)``: a NaN beats a number, then the larger (MAX) or smaller
    value, then among equals (or two NaNs) the smaller index."""
    a_nan = a != a
    b_nan = b != b
    if OP == _MAX:
        wins = a > b
    else:
        wins = a < b
    return (a_nan & ~b_nan) | (~b_nan & wins) | (((a == b) | (a_nan & b_nan)) & (ia < ib))


@triton.jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _mul_combine(a, b):
    return a * b


@triton.jit
def _load(X, XI, offs, mask, pos, OP: tl.constexpr, CAST: tl.constexpr, ACC: tl.constexpr, HAS_XI: tl.constexpr,
          WITH_INDEX: tl.constexpr):
    """One step's elements in the accumulator's dtype (the op's neutral value where masked), and
    their indices: the position along the reduced axis, or the partials' own indices."""
    x = tl.load(X + offs, mask=mask, other=0)
    if CAST is not None:
        x = cast_out(x, CAST)
    x = tl.where(mask, x.to(ACC), _neutral(OP, ACC))
    if WITH_INDEX:
        if HAS_XI:
            idx = tl.load(XI + offs, mask=mask, other=_NO_INDEX)
        else:
            idx = tl.where(mask, pos.to(tl.int64), _NO_INDEX)
    else:
        idx = x
    return x, idx


@triton.jit
def _step(acc, acc_i, x, idx, OP: tl.constexpr, WITH_INDEX: tl.constexpr):
    if WITH_INDEX:
        take = _better(x, idx, acc, acc_i, OP)
        acc = tl.where(take, x, acc)
        acc_i = tl.where(take, idx, acc_i)
    elif OP == _SUM or OP == _MEAN:
        acc = acc + x
    elif OP == _PROD:
        acc = acc * x
    elif OP == _MAX:
        acc = _max_combine(x, acc)
    else:
        acc = _min_combine(x, acc)
    return acc, acc_i


@triton.jit
def _finish(acc, acc_i, divisor, axis: tl.constexpr, OP: tl.constexpr, ACC: tl.constexpr, WITH_INDEX: tl.constexpr,
            FINAL: tl.constexpr):
    """The lanes combined along ``axis``; a mean divides its sum by ``divisor`` in the last launch.

    max/min: the extreme of the lanes, NaN where a lane holds one (the hardware's max drops NaN),
    and for the index the smallest index among the lanes holding that value (each lane's index is
    the first of its own extreme), so the first NaN or the first of equal values wins.
    """
    if OP == _SUM or OP == _MEAN:
        value = tl.sum(acc, axis)
    elif OP == _PROD:
        value = tl.reduce(acc, axis, _mul_combine)
    else:
        if OP == _MAX:
            value = tl.max(acc, axis)
        else:
            value = tl.min(acc, axis)
        if ACC.is_floating():
            nan_lane = acc != acc
            value = tl.where(tl.max(nan_lane.to(tl.int32), axis) > 0, float("nan"), value)
            hit = nan_lane | (acc == tl.expand_dims(value, axis))
        else:
            hit = acc == tl.expand_dims(value, axis)
    if WITH_INDEX:
        index = tl.min(tl.where(hit, acc_i, _NO_INDEX), axis)
    else:
        index = value  # no index: never stored
    if OP == _MEAN and FINAL:
        count = tl.zeros([], ACC) + divisor
        if ACC == tl.float32:
            value = tl.div_rn(value, count)
        else:
            value = value / count
    return value, index


@triton.jit
def _rows_kernel(
    X, XI, OUT, OUT_I, n_rows, n_cols, stride_m, stride_n, slice_len, divisor,
    OP: tl.constexpr, CAST: tl.constexpr, ACC: tl.constexpr, HAS_XI: tl.constexpr, WITH_INDEX: tl.constexpr,
    WRITE_V: tl.constexpr, WRITE_I: tl.constexpr, FINAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    lo = tl.program_id(1) * slice_len
    hi = tl.minimum(lo + slice_len, n_cols)
    acc = tl.full([BLOCK_M, BLOCK_N], _neutral(OP, ACC), ACC)
    acc_i = tl.full([BLOCK_M, BLOCK_N], _NO_INDEX, tl.int64)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (cols < hi)[None, :]
        offs = rows[:, None] * stride_m + (cols * stride_n)[None, :]
        x, idx = _load(X, XI, offs, mask, cols[None, :], OP, CAST, ACC, HAS_XI, WITH_INDEX)
        acc, acc_i = _step(acc, acc_i, x, idx, OP, WITH_INDEX)
    value, index = _finish(acc, acc_i, divisor, 1, OP, ACC, WITH_INDEX, FINAL)
    out = rows * tl.num_programs(1) + tl.program_id(1)
    if WRITE_V:
        tl.store(OUT + out, cast_out(value, OUT.dtype.element_ty), mask=row_ok)
    if WRITE_I:
        tl.store(OUT_I + out, index, mask=row_ok)


@triton.jit
def _cols_kernel(
    X, XI, OUT, OUT_I, n_red, n_inner, stride_o, stride_r, stride_i, slice_len, divisor,
    OP: tl.constexpr, CAST: tl.constexpr, ACC: tl.constexpr, HAS_XI: tl.constexpr, WITH_INDEX: tl.constexpr,
    WRITE_V: tl.constexpr, WRITE_I: tl.constexpr, FINAL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
):
    outer = tl.program_id(0).to(tl.int64)
    inner = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    inner_ok = inner < n_inner
    lo = tl.program_id(2) * slice_len
    hi = tl.minimum(lo + slice_len, n_red)
    base = outer * stride_o
    acc = tl.full([BLOCK_R, BLOCK_I], _neutral(OP, ACC), ACC)
    acc_i = tl.full([BLOCK_R, BLOCK_I], _NO_INDEX, tl.int64)
    for start in range(lo, hi, BLOCK_R):
        red = start + tl.arange(0, BLOCK_R)
        mask = (red < hi)[:, None] & inner_ok[None, :]
        offs = base + red.to(tl.int64)[:, None] * stride_r + (inner * stride_i)[None, :]
        x, idx = _load(X, XI, offs, mask, red[:, None], OP, CAST, ACC, HAS_XI, WITH_INDEX)
        acc, acc_i = _step(acc, acc_i, x, idx, OP, WITH_INDEX)
    value, index = _finish(acc, acc_i, divisor, 0, OP, ACC, WITH_INDEX, FINAL)
    out = (outer * tl.num_programs(2) + tl.program_id(2)) * n_inner + inner
    if WRITE_V:
        tl.store(OUT + out, cast_out(value, OUT.dtype.element_ty), mask=inner_ok)
    if WRITE_I:
        tl.store(OUT_I + out, index, mask=inner_ok)


_CONSTEXPRS = ("OP", "CAST", "ACC", "HAS_XI", "WITH_INDEX", "WRITE_V", "WRITE_I", "FINAL")
ROWS = Launcher(_rows_kernel, (*_CONSTEXPRS, "BLOCK_M", "BLOCK_N"), fresh=("OUT", "OUT_I"))
COLS = Launcher(_cols_kernel, (*_CONSTEXPRS, "BLOCK_R", "BLOCK_I"), fresh=("OUT", "OUT_I"))


def run(x: torch.Tensor, plan: ReducePlan) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(values, indices)`` of the reduction ``plan`` describes (None for an output the op lacks)."""
    op, v, out_shape, values_dtype, with_index, cast, acc_dtype, rows, n_slices, length, first, second, serial = plan
    device = x.device
    values = torch.empty(out_shape, dtype=values_dtype, device=device) if values_dtype is not None else None
    index = torch.empty(out_shape, dtype=torch.int64, device=device) if with_index else None
    cast_tl, acc_tl = TL_DTYPES[cast], TL_DTYPES.get(acc_dtype, tl.float32)
    launcher = ROWS if rows else COLS
    if rows:
        shape = (v.n_outer, v.n_red, v.red_stride)
    else:
        shape = (v.n_red, v.n_inner, v.outer_stride, v.red_stride, v.inner_stride)
    if second is None:
        launcher.planned(
            2 * serial, first.grid,
            (x, x, values if values is not None else index, index if index is not None else x, *shape[:2],
             *((v.outer_stride, v.red_stride) if rows else shape[2:]), length, v.n_red),
            first.num_warps, op, cast_tl, acc_tl, False, with_index, values is not None, with_index, True,
            first.block_a, first.block_b,
        )
        return values, index
    partial_shape = (v.n_outer, n_slices) if rows else (v.n_outer, n_slices, v.n_inner)
    pv = torch.empty(partial_shape, dtype=acc_dtype, device=device)
    pi = torch.empty(partial_shape, dtype=torch.int64, device=device) if with_index else pv
    strides = (v.outer_stride, v.red_stride) if rows else shape[2:]
    launcher.planned(
        2 * serial, first.grid, (x, x, pv, pi, *shape[:2], *strides, length, v.n_red),
        first.num_warps, op, cast_tl, acc_tl, False, with_index, True, with_index, False, first.block_a, first.block_b,
    )
    if rows:
        args = (pv, pi, values if values is not None else index, index if index is not None else pv,
                v.n_outer, n_slices, n_slices, 1, n_slices, v.n_red)
    else:
        args = (pv, pi, values if values is not None else index, index if index is not None else pv,
                n_slices, v.n_inner, n_slices * v.n_inner, v.n_inner, 1, n_slices, v.n_red)
    launcher.planned(
        2 * serial + 1, second.grid, args, second.num_warps, op, None, acc_tl, with_index, with_index,
        values is not None, with_index, True, second.block_a, second.block_b,
    )
    return values, index
