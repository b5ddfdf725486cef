"""Group norm forward: per-group statistics in fp32, then a tiled normalization pass.

Statistics: each program streams a share of one group's tiles (``plans.group_norm``), keeping a
running (count, mean, sum of squared deviations) updated tile by tile with Chan's pairwise
formula. Values are taken relative to a shift, the group's first element (0 if that is not
finite), and within a tile deviations are taken from the tile's own mean, so neither a large
mean nor a large sum of squares cancels. With one program per group it writes the group's
statistics itself; otherwise each leaves its partial and a small kernel combines them. The fp32
statistics kept for the normalization are (shift, mean relative to it, rstd):
``y = ((x - shift) - mean) * rstd * w + b`` loses nothing to a mean far from zero (aten's
``x * scale + shift`` form does). Traffic: ``x`` read twice, ``y`` written once, as aten's kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.group_norm import WARPS, GroupNormPlan
from ..plans.tiles import cdiv, next_power_of_2
from .alloc import new_contiguous
from .group_norm_backward import backward  # noqa: F401  (the ops call it through this module)
from .launch import Launcher, cast_out


@triton.jit
def combine(count, mean, m2, t_count, t_mean, t_m2):
    """Chan's update: the (count, mean, M2) of two disjoint sets from each set's own."""
    total = count + t_count
    frac = t_count / total
    delta = t_mean - mean
    return total, mean + delta * frac, m2 + t_m2 + delta * delta * count * frac


@triton.jit
def _gn_stats_kernel(
    X, PART, MEAN, RSTD, STATS,
    n_groups, group_channels, hw, stride_n, stride_c, stride_hw, hw_tiles, group_tiles, splits, per_split, eps,
    FINAL: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // splits
    split = pid - row * splits
    sample = row // n_groups
    group = row - sample * n_groups
    base = X + sample.to(tl.int64) * stride_n + group * group_channels * stride_c
    shift = tl.load(base).to(tl.float32)
    shift = tl.where(tl.abs(shift) <= 3.4028234663852886e38, shift, 0.0)  # NaN and infinities: no shift
    cs = tl.arange(0, BLOCK_C)
    ps = tl.arange(0, BLOCK_HW)
    count = 0.0
    mean = 0.0
    m2 = 0.0
    first = split * per_split
    last = tl.minimum(first + per_split, group_tiles)
    for t in range(first, last):
        c_tile = t // hw_tiles
        c0 = c_tile * BLOCK_C
        p0 = (t - c_tile * hw_tiles) * BLOCK_HW
        c = c0 + cs
        p = p0 + ps
        mask = (c < group_channels)[:, None] & (p < hw)[None, :]
        x = tl.load(base + c[:, None] * stride_c + p[None, :] * stride_hw, mask=mask, other=0.0).to(tl.float32)
        x = tl.where(mask, x - shift, 0.0)
        t_count = (tl.minimum(group_channels - c0, BLOCK_C) * tl.minimum(hw - p0, BLOCK_HW)).to(tl.float32)
        t_mean = tl.sum(tl.sum(x, axis=1), axis=0) / t_count
        d = tl.where(mask, x - t_mean, 0.0)
        t_m2 = tl.sum(tl.sum(d * d, axis=1), axis=0)
        count, mean, m2 = combine(count, mean, m2, t_count, t_mean, t_m2)
    if FINAL:
        rstd = tl.rsqrt(m2 / count + eps)
        tl.store(MEAN + row, cast_out(shift + mean, MEAN.dtype.element_ty))
        tl.store(RSTD + row, cast_out(rstd, RSTD.dtype.element_ty))
        tl.store(STATS + 3 * row, shift)
        tl.store(STATS + 3 * row + 1, mean)
        tl.store(STATS + 3 * row + 2, rstd)
    else:
        n_parts = tl.num_programs(0)
        tl.store(PART + pid, count)
        tl.store(PART + n_parts + pid, mean)
        tl.store(PART + 2 * n_parts + pid, m2)
        tl.store(PART + 3 * n_parts + pid, shift)


@triton.jit
def _gn_finalize_kernel(
    PART, MEAN, RSTD, STATS, n_rows, splits, eps, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Each group's statistics from its splits' partials."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    s = tl.arange(0, BLOCK_S)
    ok = row_ok[:, None] & (s < splits)[None, :]
    idx = rows[:, None] * splits + s[None, :]
    n_parts = n_rows * splits
    count = tl.load(PART + idx, mask=ok, other=0.0)
    means = tl.load(PART + n_parts + idx, mask=ok, other=0.0)
    m2s = tl.load(PART + 2 * n_parts + idx, mask=ok, other=0.0)
    total = tl.sum(count, axis=1)
    mean = tl.sum(count * means, axis=1) / total
    d = means - mean[:, None]
    m2 = tl.sum(m2s, axis=1) + tl.sum(count * d * d, axis=1)
    rstd = tl.rsqrt(m2 / total + eps)
    shift = tl.load(PART + 3 * n_parts + rows * splits, mask=row_ok, other=0.0)  # the same for every split
    tl.store(MEAN + rows, cast_out(shift + mean, MEAN.dtype.element_ty), mask=row_ok)
    tl.store(RSTD + rows, cast_out(rstd, RSTD.dtype.element_ty), mask=row_ok)
    tl.store(STATS + 3 * rows, shift, mask=row_ok)
    tl.store(STATS + 3 * rows + 1, mean, mask=row_ok)
    tl.store(STATS + 3 * rows + 2, rstd, mask=row_ok)


@triton.jit
def _gn_normalize_kernel(
    X, W, B, Y, STATS,
    n_channels, hw, n_groups, group_channels, stride_n, stride_c, stride_hw, c_blocks, hw_blocks,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):
    pid = tl.program_id(0)
    rest = pid // hw_blocks
    p_block = pid - rest * hw_blocks
    sample = rest // c_blocks
    c_block = rest - sample * c_blocks
    c = c_block * BLOCK_C + tl.arange(0, BLOCK_C)
    p = p_block * BLOCK_HW + tl.arange(0, BLOCK_HW)
    c_ok = c < n_channels
    mask = c_ok[:, None] & (p < hw)[None, :]
    row = sample * n_groups + c // group_channels
    shift = tl.load(STATS + 3 * row, mask=c_ok, other=0.0)
    mean = tl.load(STATS + 3 * row + 1, mask=c_ok, other=0.0)
    scale = tl.load(STATS + 3 * row + 2, mask=c_ok, other=0.0)
    if HAS_W:
        scale = scale * tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
    offsets = sample.to(tl.int64) * stride_n + c[:, None] * stride_c + p[None, :] * stride_hw
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    y = ((x - shift[:, None]) - mean[:, None]) * scale[:, None]
    if HAS_B:
        y = y + tl.load(B + c, mask=c_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + offsets, cast_out(y, Y.dtype.element_ty), mask=mask)


_STATS = Launcher(_gn_stats_kernel, ("FINAL", "BLOCK_C", "BLOCK_HW"), fresh=("PART", "MEAN", "RSTD", "STATS"))
_FINALIZE = Launcher(_gn_finalize_kernel, ("BLOCK_R", "BLOCK_S"), fresh=("PART", "MEAN", "RSTD", "STATS"))
_NORMALIZE = Launcher(_gn_normalize_kernel, ("HAS_W", "HAS_B", "BLOCK_C", "BLOCK_HW"), fresh=("Y",))
_FINALIZE_TILE = 1024  # partials one finalize program combines


def run_forward(
    x: torch.Tensor, plan: GroupNormPlan, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, mean, rstd)`` as ``native_group_norm`` returns them: ``y`` in ``x``'s format and dtype,
    the statistics ``[N, G]`` in ``x``'s dtype (computed and applied in fp32)."""
    view, rows = plan.view, plan.stat_shape[0] * plan.stat_shape[1]
    y = torch.empty_like(x)
    mean = new_contiguous(x, plan.stat_shape, x.dtype)
    rstd = new_contiguous(x, plan.stat_shape, x.dtype)
    stats = new_contiguous(x, (rows, 3), torch.float32)  # fp32 (shift, mean - shift, rstd) per group
    final = plan.splits == 1
    part = stats if final else new_contiguous(x, (4, rows * plan.splits), torch.float32)
    strides = (view.stride_n, view.stride_c, view.stride_hw)
    eps = float(eps)
    _STATS.planned(
        (plan.serial, x.dtype), (rows * plan.splits,),
        (x, part, mean, rstd, stats, plan.groups, plan.group_channels, view.hw, *strides,
         plan.hw_tiles, plan.group_tiles, plan.splits, plan.per_split, eps),
        WARPS, final, plan.stats_tile.block_c, plan.stats_tile.block_hw,
    )
    if not final:
        block_s = next_power_of_2(plan.splits)
        block_r = max(1, min(next_power_of_2(rows), _FINALIZE_TILE // block_s))
        _FINALIZE.planned(
            (plan.serial, x.dtype), (cdiv(rows, block_r),), (part, mean, rstd, stats, rows, plan.splits, eps),
            4, block_r, block_s,
        )
    tile = plan.elem_tile
    _NORMALIZE.planned(
        (plan.serial, x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype),
        plan.elem_grid,
        (x, x if weight is None else weight, x if bias is None else bias, y, stats,
         view.c, view.hw, plan.groups, plan.group_channels, *strides, plan.c_blocks, plan.hw_blocks),
        WARPS, weight is not None, bias is not None, tile.block_c, tile.block_hw,
    )
    return y, mean, rstd
