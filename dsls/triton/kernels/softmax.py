"""Softmax and log-softmax over rows, forward and backward.

Rows up to ``MAX_ROW_BLOCK`` wide are held whole in registers, several short rows per program.
Longer rows (vocabulary-sized log-softmax) take one program per row that streams the row in
chunks: an online max/sum pass, then a pass that writes the result.
"""

from __future__ import annotations

from types import ModuleType

import torch
import triton
import triton.language as tl

from python_native_dsls.triton.ops._tiles import RowPlan

from .launch import Launcher, cast_out

# Chunk width and warps for the streaming kernels.
LOOP_BLOCK = 4096
LOOP_WARPS = 16


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
def _softmax_fwd_looped_kernel(X, Y, n_cols, stride_xm, stride_xn, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    y_row = Y + row * n_cols
    # Per-lane running max and sum of exp(x - max); lanes that saw only -inf keep a zero sum.
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols * stride_xn, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.exp(x - ref)
        m = m_new
    row_max = tl.max(m, axis=0)
    ref = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp(m - ref), axis=0)
    log_total = tl.log(total)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < n_cols
        z = tl.load(x_row + cols * stride_xn, mask=ok, other=0.0).to(tl.float32) - row_max
        if LOG:
            y = z - log_total
        else:
            y = tl.exp(z) / total
        tl.store(y_row + cols, cast_out(y, Y.dtype.element_ty), mask=ok)


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


@triton.jit
def _softmax_bwd_looped_kernel(
    DY, Y, DX, n_cols, stride_dym, stride_dyn, stride_ym, stride_yn,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dy_row = DY + row * stride_dym
    y_row = Y + row * stride_ym
    dx_row = DX + row * n_cols
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < n_cols
        dy = tl.load(dy_row + cols * stride_dyn, mask=ok, other=0.0).to(tl.float32)
        if LOG:
            acc += dy
        else:
            acc += dy * tl.load(y_row + cols * stride_yn, mask=ok, other=0.0).to(tl.float32)
    dot = tl.sum(acc, axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        ok = cols < n_cols
        dy = tl.load(dy_row + cols * stride_dyn, mask=ok, other=0.0).to(tl.float32)
        y = tl.load(y_row + cols * stride_yn, mask=ok, other=0.0).to(tl.float32)
        if LOG:
            dx = dy - tl.exp(y) * dot
        else:
            dx = y * (dy - dot)
        tl.store(dx_row + cols, cast_out(dx, DX.dtype.element_ty), mask=ok)


_FWD = Launcher(_softmax_fwd_kernel, ("LOG", "BLOCK_M", "BLOCK_N"), fresh=("Y",))
_FWD_LOOPED = Launcher(_softmax_fwd_looped_kernel, ("LOG", "BLOCK_N"))
_BWD = Launcher(_softmax_bwd_kernel, ("LOG", "BLOCK_M", "BLOCK_N"), fresh=("DX",))
_BWD_LOOPED = Launcher(_softmax_bwd_looped_kernel, ("LOG", "BLOCK_N"))


def run_forward(x: torch.Tensor, plan: RowPlan, log: bool) -> torch.Tensor:
    """(Log-)softmax of each row of ``x`` along a plan from ``ops.softmax`` (layout work done once
    per key): a contiguous tensor of the plan's output dtype shaped like ``x``."""
    rows, _, out_dtype, fresh_like, looped, grid, num_warps, block_m, block_n, serial = plan
    if looped:
        return _long_rows().forward(x, rows, out_dtype, log).view(x.shape)
    if fresh_like:
        y = torch.empty_like(x)
    else:
        y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    _FWD.planned(serial + log, grid, (x, y, *rows), num_warps, log, block_m, block_n)
    return y


def run_backward(dy: torch.Tensor, y: torch.Tensor, plan: RowPlan, log: bool) -> torch.Tensor:
    """Input gradient of (log-)softmax from its output ``y``, along a plan from ``ops.softmax``:
    a contiguous tensor shaped like ``y``."""
    rows, grad_rows, out_dtype, fresh_like, looped, grid, num_warps, block_m, block_n, serial = plan
    if looped:
        return _long_rows().backward(dy, grad_rows, y, rows, out_dtype, log).view(y.shape)
    if fresh_like:
        dx = torch.empty_like(y)
    else:
        dx = torch.empty_like(y, dtype=out_dtype, memory_format=torch.contiguous_format)
    n_rows, n_cols, row_stride, col_stride = rows
    _BWD.planned(
        serial + log, grid,
        (dy, y, dx, n_rows, n_cols, grad_rows.row_stride, grad_rows.col_stride, row_stride, col_stride),
        num_warps, log, block_m, block_n,
    )
    return dx


def _long_rows() -> ModuleType:
    """The long-row paths (imported on first use: that module builds on the kernels here)."""
    from . import softmax_long

    return softmax_long
