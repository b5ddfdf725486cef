"""Layer norm and RMS norm over rows held whole in registers, forward and backward.

Both norms share one kernel pair: RMS norm is layer norm without the mean (``IS_RMS``). Each
program normalizes ``BLOCK_M`` rows at once, so short rows still fill a tile. The backward
programs are persistent: each walks a strided set of row blocks and keeps its share of the
weight and bias gradients in fp32 registers, written once as a partial sum per program.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from dsls.triton.ops._layout import Rows

from .launch import Launcher, cast_out, program_slots, row_config


@triton.jit
def _norm_fwd_kernel(
    X, W, B, Y, MEAN, RSTD,
    n_rows, n_cols, stride_xm, stride_xn, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    rows = rows.to(tl.int64)

    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
    x = x.to(tl.float32)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / n_cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        tl.store(MEAN + rows, cast_out(mean, MEAN.dtype.element_ty), mask=row_ok)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
    tl.store(RSTD + rows, cast_out(rstd, RSTD.dtype.element_ty), mask=row_ok)

    y = xc * rstd[:, None]
    if HAS_W:
        y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * n_cols + cols[None, :], cast_out(y, Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_kernel(
    DY, X, W, MEAN, RSTD, DX, DW, DB,
    n_rows, n_cols, stride_dym, stride_dyn, stride_xm, stride_xn,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)

    for start in range(pid * BLOCK_M, n_rows, tl.num_programs(0) * BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        dy = tl.load(DY + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0).to(tl.float32)
        if IS_RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0).to(tl.float32)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)

        if NEED_DX:
            if HAS_W:
                g = dy * w[None, :]
            else:
                g = dy
            c1 = tl.sum(xhat * g, axis=1) / n_cols
            if IS_RMS:
                dx = (g - xhat * c1[:, None]) * rstd[:, None]
            else:
                c2 = tl.sum(g, axis=1) / n_cols
                dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
            tl.store(DX + rows[:, None] * n_cols + cols[None, :], cast_out(dx, DX.dtype.element_ty), mask=mask)
        if NEED_DW:
            dw += tl.sum(dy * xhat, axis=0)
        if NEED_DB:
            db += tl.sum(dy, axis=0)

    if NEED_DW:
        tl.store(DW + pid * n_cols + cols, dw, mask=col_ok)
    if NEED_DB:
        tl.store(DB + pid * n_cols + cols, db, mask=col_ok)


_FWD = Launcher(_norm_fwd_kernel, ("IS_RMS", "HAS_W", "HAS_B", "BLOCK_M", "BLOCK_N"))
_BWD = Launcher(_norm_bwd_kernel, ("IS_RMS", "HAS_W", "NEED_DX", "NEED_DW", "NEED_DB", "BLOCK_M", "BLOCK_N"))


def forward(
    x: torch.Tensor,
    rows: Rows,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    stats_dtype: torch.dtype,
    rms: bool,
    stat_shape: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Normalize ``x`` seen as ``rows``: ``(y, mean or None, rstd)``, all contiguous.

    ``y`` is shaped like ``x``, the statistics ``[M]`` or ``stat_shape`` (as many elements):
    outputs are allocated in their final shape, with no view afterwards.
    """
    m, n = rows.n_rows, rows.n_cols
    # empty_like / new_empty are the cheapest allocation calls from Python.
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    stats = (m,) if stat_shape is None else stat_shape
    rstd = x.new_empty(stats, dtype=stats_dtype)
    mean = None if rms else x.new_empty(stats, dtype=stats_dtype)
    cfg = row_config(m, n)
    _FWD(
        ((m + cfg.block_m - 1) // cfg.block_m,),
        (
            x, x if weight is None else weight, x if bias is None else bias, y,
            rstd if mean is None else mean, rstd, m, n, rows.row_stride, rows.col_stride, float(eps),
        ),
        cfg.num_warps, rms, weight is not None, bias is not None, cfg.block_m, cfg.block_n,
    )
    return y, mean, rstd


def backward(
    dy: torch.Tensor,
    dy_rows: Rows,
    x: torch.Tensor,
    x_rows: Rows,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    need: tuple[bool, bool, bool],
    rms: bool,
    param_shape: Sequence[int] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients ``(dx, dw fp32, db fp32)``; entries not in ``need`` are None.

    ``dx`` is shaped like ``x``, ``dw`` and ``db`` are ``[N]`` or ``param_shape``, all contiguous.
    ``mean`` and ``rstd`` are read as flat per-row vectors (any float dtype).
    """
    need_dx, need_dw, need_db = need
    if not any(need):
        return None, None, None
    m, n = x_rows.n_rows, x_rows.n_cols
    cfg = row_config(m, n)
    blocks = (m + cfg.block_m - 1) // cfg.block_m
    programs = min(blocks, program_slots(x.device)) if (need_dw or need_db) else blocks
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else None
    # One partial row of parameter gradients per program, summed below; a single program
    # writes the final gradient directly.
    partials = (programs, n) if programs > 1 else ((n,) if param_shape is None else param_shape)
    dw = x.new_empty(partials, dtype=torch.float32) if need_dw else None
    db = x.new_empty(partials, dtype=torch.float32) if need_db else None
    _BWD(
        (programs,),
        (
            dy, x, x if weight is None else weight, rstd if mean is None else mean, rstd,
            x if dx is None else dx, rstd if dw is None else dw, rstd if db is None else db,
            m, n, dy_rows.row_stride, dy_rows.col_stride, x_rows.row_stride, x_rows.col_stride,
        ),
        cfg.num_warps, rms, weight is not None, need_dx, need_dw, need_db, cfg.block_m, cfg.block_n,
    )
    if programs > 1:
        final = (n,) if param_shape is None else param_shape
        dw = None if dw is None else dw.sum(0).view(final)
        db = None if db is None else db.sum(0).view(final)
    return dx, dw, db
