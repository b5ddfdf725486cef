"""The per-tile steps the norm backward kernels share (``kernels.norm_backward``), as inlined
``@triton.jit`` functions: each kernel walks its tiles its own way and composes the same steps, so
they cost no extra load or store."""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import cast_out


@triton.jit
def load_weight(W, cols, col_ok, w_offset, CAST_X: tl.constexpr):
    """``offset + weight`` in fp32 (rounded to the weight's dtype under the Llama casting rule)."""
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + w_offset
    if CAST_X:
        w = cast_out(w, W.dtype.element_ty).to(tl.float32)
    return w


@triton.jit
def weighted(xhat, X, CAST_X: tl.constexpr):
    """What the weight multiplied in the forward: ``xhat``, or its value in x's dtype under ``CAST_X``."""
    if CAST_X:
        xhat = cast_out(xhat, X.dtype.element_ty).to(tl.float32)
    return xhat


@triton.jit
def row_rstd(x, n_cols, eps):
    """Each row's ``1 / sqrt(mean(x^2) + eps)``, recomputed from x (RMS norm keeps no statistics)."""
    xf = x.to(tl.float32)
    return tl.rsqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)


@triton.jit
def xhat_and_grad(x, dy, w, mean, rstd, mask, IS_RMS: tl.constexpr, HAS_W: tl.constexpr):
    """Normalized input and the gradient reaching it through the weight, in fp32."""
    x = x.to(tl.float32)
    dy = dy.to(tl.float32)
    if IS_RMS:
        xhat = x * rstd[:, None]
    else:
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    if HAS_W:
        g = dy * w[None, :]
    else:
        g = dy
    return xhat, dy, g


@triton.jit
def row_tile(start, last, col_ok, BLOCK_M: tl.constexpr):
    """Rows ``start ..< start + BLOCK_M`` as int64 offsets, which of them lie below ``last``, and the tile's mask."""
    rows = start + tl.arange(0, BLOCK_M)
    row_ok = rows < last
    mask = row_ok[:, None] & col_ok[None, :]
    return rows.to(tl.int64), row_ok, mask


@triton.jit
def load_tiles(X, DY, rows, cols, mask, stride_xm, stride_xn, stride_dym, stride_dyn):
    """One ``[rows, cols]`` tile of x and of dy, zero outside ``mask``."""
    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask, other=0.0)
    return x, dy


@triton.jit
def row_stats(MEAN, RSTD, rows, row_ok, IS_RMS: tl.constexpr):
    """The rows' saved ``(mean, rstd)`` in fp32 (RMS norm keeps no mean: rstd stands in for it)."""
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0).to(tl.float32)
    mean = rstd if IS_RMS else tl.load(MEAN + rows, mask=row_ok, other=0.0).to(tl.float32)
    return mean, rstd


@triton.jit
def store_dx(DX, rows, cols, mask, n_cols, xhat, g, rstd, c1, c2, IS_RMS: tl.constexpr):
    """``dx = (g - xhat * c1 - c2) * rstd`` from the row sums (no ``c2`` term for RMS norm)."""
    if IS_RMS:
        dx = (g - xhat * c1[:, None]) * rstd[:, None]
    else:
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    tl.store(DX + rows[:, None] * n_cols + cols[None, :], cast_out(dx, DX.dtype.element_ty), mask=mask)


@triton.jit
def zero_partials(BLOCK_N: tl.constexpr):
    """A strip's running dw and db column sums, in fp32, at zero."""
    return tl.zeros([BLOCK_N], dtype=tl.float32), tl.zeros([BLOCK_N], dtype=tl.float32)


@triton.jit
def accumulate_dw_db(dw, db, dy, xhat, X, CAST_X: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr):
    """Add one tile's column sums to the running dw / db partials."""
    if NEED_DW:
        dw += tl.sum(dy * weighted(xhat, X, CAST_X), axis=0)
    if NEED_DB:
        db += tl.sum(dy, axis=0)
    return dw, db


@triton.jit
def store_partials(PART, index, n_cols, cols, col_ok, dw, db, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr):
    """Row ``index`` of the ``[programs, 2N]`` partial buffer: dw in its first N columns, db in the next N."""
    part = PART + index.to(tl.int64) * (2 * n_cols)
    if NEED_DW:
        tl.store(part + cols, cast_out(dw, PART.dtype.element_ty), mask=col_ok)
    if NEED_DB:
        tl.store(part + n_cols + cols, cast_out(db, PART.dtype.element_ty), mask=col_ok)
