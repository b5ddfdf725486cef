"""Softmax and log-softmax kernels that hold whole rows in registers, forward and backward.

Each program takes ``BLOCK_M`` rows of up to ``BLOCK_N`` columns: several short rows packed into one
tile (``softmax``'s planned launches) or a single wide row (``softmax_long``'s one-program path).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import Launcher, cast_out


@triton.jit
def _softmax_fwd_kernel(
    X, Y, n_rows, n_cols, stride_xm, stride_xn,
    LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    rows = rows.to(tl.int64)

    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
    x = tl.where(col_ok[None, :], x.to(tl.float32), float("-inf"))
    z = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(z)
    total = tl.sum(e, axis=1)
    if LOG:
        y = z - tl.log(total)[:, None]
    else:
        y = e / total[:, None]
    tl.store(Y + rows[:, None] * n_cols + cols[None, :], cast_out(y, Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_kernel(
    DY, Y, DX, n_rows, n_cols, stride_dym, stride_dyn, stride_ym, stride_yn,
    LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    rows = rows.to(tl.int64)

    dy = tl.load(DY + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask, other=0.0)
    y = tl.load(Y + rows[:, None] * stride_ym + cols[None, :] * stride_yn, mask=mask, other=0.0)
    dy = dy.to(tl.float32)
    y = y.to(tl.float32)
    if LOG:
        dx = dy - tl.exp(y) * tl.sum(dy, axis=1)[:, None]
    else:
        dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
    tl.store(DX + rows[:, None] * n_cols + cols[None, :], cast_out(dx, DX.dtype.element_ty), mask=mask)


FWD = Launcher(_softmax_fwd_kernel, ("LOG", "BLOCK_M", "BLOCK_N"), fresh=("Y",), op="_softmax, _log_softmax")
BWD = Launcher(_softmax_bwd_kernel, ("LOG", "BLOCK_M", "BLOCK_N"), fresh=("DX",),
             op="_softmax_backward_data, _log_softmax_backward_data")
