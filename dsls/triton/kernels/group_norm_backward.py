"""Group norm backward: per-channel sums, per-group coefficients, parameter gradients, then dx.

With ``xhat = (x - mean) * rstd`` over a group of ``L = C/G * HW`` elements, per sample and group

    dx = rstd * w * dy + q * (x - mean) + p,   q = -A * rstd^3 / L,   p = -B * rstd / L
    A = sum_c w[c] * sum_hw(dy * (x - mean)),   B = sum_c w[c] * sum_hw(dy)

and per channel ``dw[c] = sum_n rstd * sum_hw(dy * (x - mean))``, ``db[c] = sum_n sum_hw(dy)``
(``w = 1`` without a weight). This is aten's formulation with the mean taken out of each sum
rather than subtracted after it, so a mean far from zero cancels nothing. Four launches: the
per-(sample, channel) sums, split over spatial tiles so that every SM has work (partials in an
fp32 ``[2, splits, N*C]`` buffer, L2 resident); the per-group coefficients ``q, p``; the parameter
gradients; the elementwise dx. Traffic: ``x`` and ``dy`` read twice, ``dx`` written once, as aten's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.group_norm import WARPS, ChannelView, GroupNormPlan
from ..plans.tiles import cdiv, next_power_of_2
from .alloc import new_contiguous
from .launch import Launcher, cast_out

_VECTOR = 1024  # channels a coefficient or parameter-gradient program holds per step
# The sums kernel keeps two fp32 accumulators per tile element: 16 warps hold a 4096-element tile
# at 8 elements per thread (one 16-byte vector of a 16-bit dtype), about 100 registers (sm_90a).
_SUMS_WARPS = 16


@triton.jit
def _gn_bwd_sums_kernel(
    DY, X, MEAN, PART,
    n_channels, hw, nc, n_groups, group_channels, dy_stride_n, dy_stride_c, dy_stride_hw, stride_n, stride_c,
    stride_hw, c_blocks, hw_tiles, splits, per_split,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):
    """Per (sample, channel), over one split of the spatial tiles: ``sum(dy * (x - mean))`` and ``sum(dy)``."""
    pid = tl.program_id(0)
    rest = pid // splits
    split = pid - rest * splits
    sample = rest // c_blocks
    c = (rest - sample * c_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < n_channels
    mean = tl.load(MEAN + sample * n_groups + c // group_channels, mask=c_ok, other=0.0).to(tl.float32)
    dy_base = DY + sample.to(tl.int64) * dy_stride_n + c[:, None] * dy_stride_c
    x_base = X + sample.to(tl.int64) * stride_n + c[:, None] * stride_c
    acc_dyx = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_dy = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    first = split * per_split
    last = tl.minimum(first + per_split, hw_tiles)
    for t in range(first, last):
        p = t * BLOCK_HW + tl.arange(0, BLOCK_HW)
        mask = c_ok[:, None] & (p < hw)[None, :]
        dy = tl.load(dy_base + p[None, :] * dy_stride_hw, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_base + p[None, :] * stride_hw, mask=mask, other=0.0).to(tl.float32)
        acc_dyx += dy * tl.where(mask, x - mean[:, None], 0.0)
        acc_dy += dy
    out = PART + split * nc + sample * n_channels + c
    tl.store(out, tl.sum(acc_dyx, axis=1), mask=c_ok)
    tl.store(out + splits * nc, tl.sum(acc_dy, axis=1), mask=c_ok)


@triton.jit
def _split_sums(PART, sample, c, ok, n_channels, nc, splits, BLOCK_C: tl.constexpr):
    """Channels ``c`` of ``sample``: their ``sum(dy * (x - mean))`` and ``sum(dy)``, added over the sums
    kernel's splits of the spatial axis (``PART``: the first half per split, then the second)."""
    dyx = tl.zeros([BLOCK_C], dtype=tl.float32)
    dy = tl.zeros([BLOCK_C], dtype=tl.float32)
    for s in range(splits):
        idx = s * nc + sample * n_channels + c
        dyx += tl.load(PART + idx, mask=ok, other=0.0)
        dy += tl.load(PART + splits * nc + idx, mask=ok, other=0.0)
    return dyx, dy


@triton.jit
def _gn_bwd_coeffs_kernel(
    PART, W, RSTD, COEF, n_groups, group_channels, n_channels, nc, splits, group_size,
    HAS_W: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Per (sample, group): the ``q`` and ``p`` of dx."""
    row = tl.program_id(0)
    sample = row // n_groups
    group = row - sample * n_groups
    acc_a = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_C], dtype=tl.float32)
    for c0 in range(0, group_channels, BLOCK_C):
        ci = c0 + tl.arange(0, BLOCK_C)
        ok = ci < group_channels
        c = group * group_channels + ci
        ds, db = _split_sums(PART, sample, c, ok, n_channels, nc, splits, BLOCK_C)
        if HAS_W:
            w = tl.load(W + c, mask=ok, other=0.0).to(tl.float32)
            ds = ds * w
            db = db * w
        acc_a += ds
        acc_b += db
    a = tl.sum(acc_a, axis=0)
    b = tl.sum(acc_b, axis=0)
    rstd = tl.load(RSTD + row).to(tl.float32)
    tl.store(COEF + 2 * row, -a * rstd * rstd * rstd / group_size)
    tl.store(COEF + 2 * row + 1, -b * rstd / group_size)


@triton.jit
def _gn_bwd_params_kernel(
    PART, RSTD, DW, DB, n_samples, n_channels, n_groups, group_channels, nc, splits,
    NEED_DW: tl.constexpr, NEED_DB: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Per channel: ``dw`` and ``db``, summed over samples in fp32 and stored in the parameters' dtype."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = c < n_channels
    group = c // group_channels
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_C], dtype=tl.float32)
    for sample in range(n_samples):
        ds, dbs = _split_sums(PART, sample, c, ok, n_channels, nc, splits, BLOCK_C)
        if NEED_DW:
            dw += ds * tl.load(RSTD + sample * n_groups + group, mask=ok, other=0.0).to(tl.float32)
        db += dbs
    if NEED_DW:
        tl.store(DW + c, cast_out(dw, DW.dtype.element_ty), mask=ok)
    if NEED_DB:
        tl.store(DB + c, cast_out(db, DB.dtype.element_ty), mask=ok)


@triton.jit
def _gn_bwd_dx_kernel(
    DY, X, W, MEAN, RSTD, COEF, DX,
    n_channels, hw, n_groups, group_channels, dy_stride_n, dy_stride_c, dy_stride_hw, stride_n, stride_c, stride_hw,
    c_blocks, hw_blocks,
    HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):
    pid = tl.program_id(0)
    rest = pid // hw_blocks
    p_block = pid - rest * hw_blocks
    sample = rest // c_blocks
    c = (rest - sample * c_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    p = p_block * BLOCK_HW + tl.arange(0, BLOCK_HW)
    c_ok = c < n_channels
    mask = c_ok[:, None] & (p < hw)[None, :]
    row = sample * n_groups + c // group_channels
    mean = tl.load(MEAN + row, mask=c_ok, other=0.0).to(tl.float32)
    scale = tl.load(RSTD + row, mask=c_ok, other=0.0).to(tl.float32)
    if HAS_W:
        scale = scale * tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
    q = tl.load(COEF + 2 * row, mask=c_ok, other=0.0)
    shift = tl.load(COEF + 2 * row + 1, mask=c_ok, other=0.0)
    dy_offsets = sample.to(tl.int64) * dy_stride_n + c[:, None] * dy_stride_c + p[None, :] * dy_stride_hw
    offsets = sample.to(tl.int64) * stride_n + c[:, None] * stride_c + p[None, :] * stride_hw
    dy = tl.load(DY + dy_offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dx = scale[:, None] * dy + q[:, None] * (x - mean[:, None]) + shift[:, None]
    tl.store(DX + offsets, cast_out(dx, DX.dtype.element_ty), mask=mask)


_SUMS = Launcher(_gn_bwd_sums_kernel, ("BLOCK_C", "BLOCK_HW"), fresh=("PART",))
_COEFFS = Launcher(_gn_bwd_coeffs_kernel, ("HAS_W", "BLOCK_C"), fresh=("COEF",))
_PARAMS = Launcher(_gn_bwd_params_kernel, ("NEED_DW", "NEED_DB", "BLOCK_C"), fresh=("DW", "DB"))
_DX = Launcher(_gn_bwd_dx_kernel, ("HAS_W", "BLOCK_C", "BLOCK_HW"), fresh=("DX",))


def backward(
    dy: torch.Tensor,
    dy_view: ChannelView,
    x: torch.Tensor,
    plan: GroupNormPlan,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    need: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dw, db)`` as ``native_group_norm_backward`` returns them (None where ``need`` says so):
    ``dx`` in ``x``'s format and dtype, ``dw`` / ``db`` ``[C]`` in the weight's dtype (``x``'s without one)."""
    need_dx, need_dw, need_db = need
    if not (need_dx or need_dw or need_db):
        return None, None, None
    view, tile = plan.view, plan.elem_tile
    n, c, hw = view.n, view.c, view.hw
    nc, splits = n * c, plan.sum_splits
    has_w = weight is not None
    w = x if weight is None else weight
    strides = (dy_view.stride_n, dy_view.stride_c, dy_view.stride_hw, view.stride_n, view.stride_c, view.stride_hw)
    key = (plan.serial, dy_view, dy.dtype, w.dtype, mean.dtype, rstd.dtype)
    part = new_contiguous(x, (2, splits, nc), torch.float32)
    _SUMS.planned(
        key, (n * plan.c_blocks * splits,),
        (dy, x, mean, part, c, hw, nc, plan.groups, plan.group_channels, *strides, plan.c_blocks, plan.hw_blocks,
         splits, plan.sum_per_split),
        _SUMS_WARPS, tile.block_c, tile.block_hw,
    )
    dx = dw = db = None
    if need_dx:
        rows = n * plan.groups
        coef = new_contiguous(x, (rows, 2), torch.float32)
        block = min(next_power_of_2(plan.group_channels), _VECTOR)
        _COEFFS.planned(
            (key, has_w), (rows,),
            (part, w, rstd, coef, plan.groups, plan.group_channels, c, nc, splits,
             float(plan.group_channels * hw)),
            4, has_w, block,
        )
        dx = torch.empty_like(x)
        _DX.planned(
            (key, has_w), plan.elem_grid,
            (dy, x, w, mean, rstd, coef, dx, c, hw, plan.groups, plan.group_channels, *strides,
             plan.c_blocks, plan.hw_blocks),
            WARPS, has_w, tile.block_c, tile.block_hw,
        )
    if need_dw or need_db:
        param_dtype = w.dtype
        dw = new_contiguous(x, (c,), param_dtype) if need_dw else None
        db = new_contiguous(x, (c,), param_dtype) if need_db else None
        block = min(next_power_of_2(c), _VECTOR // 4)
        _PARAMS.planned(
            (key, need_dw, need_db), (cdiv(c, block),),
            (part, rstd, x if dw is None else dw, x if db is None else db,
             n, c, plan.groups, plan.group_channels, nc, splits),
            4, need_dw, need_db, block,
        )
    return dx, dw, db
