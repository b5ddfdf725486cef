"""Layer norm and RMS norm over rows held whole in registers, forward and backward.

Both norms share one forward kernel: RMS norm is layer norm without the mean (``IS_RMS``). Each
program normalizes ``BLOCK_M`` rows at once, so short rows still fill a tile. The backward lives
in ``norm_backward`` (register and column-streamed paths, two-stage weight gradients).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsls.triton.ops._layout import Rows

from . import norm_backward
from .launch import cast_out, on_device, row_config


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


def forward(
    x: torch.Tensor,
    rows: Rows,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    stats_dtype: torch.dtype,
    rms: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Normalize ``x`` seen as ``rows``: ``(y [M, N] contiguous, mean [M] or None, rstd [M])``."""
    m, n = rows.n_rows, rows.n_cols
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=stats_dtype, device=x.device)
    mean = None if rms else torch.empty((m,), dtype=stats_dtype, device=x.device)
    cfg = row_config(m, n)
    with on_device(x):
        _norm_fwd_kernel[(triton.cdiv(m, cfg.block_m),)](
            x, x if weight is None else weight, x if bias is None else bias, y,
            rstd if mean is None else mean, rstd,
            m, n, rows.row_stride, rows.col_stride, eps,
            IS_RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
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
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients ``(dx [M, N], dw [N] fp32, db [N] fp32)``; entries not in ``need`` are None.

    ``mean`` and ``rstd`` are read as flat per-row vectors (any float dtype).
    """
    return norm_backward.backward(dy, dy_rows, x, x_rows, mean, rstd, weight, need, rms)
