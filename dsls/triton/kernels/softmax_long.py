"""Softmax and log-softmax over rows too long for the packed-row kernels, forward and backward.

Three paths, by row width (limits and tiles from ``tuning``):

- Whole row in one program (up to ``SOFTMAX_SINGLE_MAX`` columns, up to 32 warps): the input is
  read once and the output written once (forward: 1 read + 1 write per element; backward: y and
  dy read once, dx written once).
- Split row (wider rows, vocabularies): each row is cut into slices of ``SOFTMAX_SLICE`` columns,
  one program per (row, slice), so that even a few thousand rows fill every SM. A first kernel
  writes each slice's partial max and sum of exp (backward: partial dot product); a second
  merges the row's partials (a vector of a few floats) and writes its slice. No atomics, no
  inter-program waiting. Forward: 2 reads + 1 write per element; backward: 2 reads of dy (and
  of y for softmax; 1 for log-softmax) + 1 write.
- Rows with more than ``SOFTMAX_MAX_SLICES`` slices stream one row per program, in chunks: an
  online max/sum pass, then a pass that writes the result (the looped kernels).

``path`` picks one of them whatever the width (``"split"``, ``"streamed"``; ``"auto"``: by width,
as above): the ops expose them as variants, to weigh the one-pass path against the split one
where the backward spills, or to pin one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from python_native_dsls.layout import Rows

from ..plans.tiles import cdiv, next_power_of_2
from . import tuning
from .launch import Launcher, cast_out
from .softmax_rows import BWD, FWD

# Chunk width and warps for the looped (streaming) kernels.
LOOP_BLOCK = 4096
LOOP_WARPS = 16


@triton.jit
def _max_and_sum_exp(x_row, stride_xn, lo, hi, BLOCK_N: tl.constexpr):
    """Max of ``x[lo:hi]`` and the sum of ``exp(x - max)`` over it (0 when all of it is -inf), in one
    online pass: per-lane running max and sum, rescaled when the max grows."""
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols * stride_xn, mask=cols < hi, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.exp(x - ref)
        m = m_new
    top = tl.max(m, axis=0)
    ref = tl.where(top == float("-inf"), 0.0, top)
    return top, tl.sum(s * tl.exp(m - ref), axis=0)


@triton.jit
def _write_probs(x_row, y_row, stride_xn, lo, hi, row_max, total, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """``y[lo:hi]``: ``softmax`` or ``log_softmax`` of x from the whole row's max and sum of exp."""
    log_total = tl.log(total)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        z = tl.load(x_row + cols * stride_xn, mask=col_ok, other=0.0).to(tl.float32) - row_max
        if LOG:
            y = z - log_total
        else:
            y = tl.exp(z) / total
        tl.store(y_row + cols, cast_out(y, y_row.dtype.element_ty), mask=col_ok)


@triton.jit
def _grad_dot(dy_row, y_row, stride_dyn, stride_yn, lo, hi, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """``sum(dy * y)`` (softmax) or ``sum(dy)`` (log-softmax) over ``[lo, hi)``."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        dy = tl.load(dy_row + cols * stride_dyn, mask=col_ok, other=0.0).to(tl.float32)
        if LOG:
            acc += dy
        else:
            acc += dy * tl.load(y_row + cols * stride_yn, mask=col_ok, other=0.0).to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def _write_grad(dy_row, y_row, dx_row, stride_dyn, stride_yn, lo, hi, dot, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dx[lo:hi]`` from the whole row's ``dot`` (see ``_grad_dot``)."""
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        dy = tl.load(dy_row + cols * stride_dyn, mask=col_ok, other=0.0).to(tl.float32)
        y = tl.load(y_row + cols * stride_yn, mask=col_ok, other=0.0).to(tl.float32)
        if LOG:
            dx = dy - tl.exp(y) * dot
        else:
            dx = y * (dy - dot)
        tl.store(dx_row + cols, cast_out(dx, dx_row.dtype.element_ty), mask=col_ok)


@triton.jit
def _softmax_fwd_looped_kernel(X, Y, n_cols, stride_xm, stride_xn, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    row_max, total = _max_and_sum_exp(x_row, stride_xn, 0, n_cols, BLOCK_N)
    _write_probs(x_row, Y + row * n_cols, stride_xn, 0, n_cols, row_max, total, LOG, BLOCK_N)


@triton.jit
def _softmax_bwd_looped_kernel(
    DY, Y, DX, n_cols, stride_dym, stride_dyn, stride_ym, stride_yn,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dy_row = DY + row * stride_dym
    y_row = Y + row * stride_ym
    dot = _grad_dot(dy_row, y_row, stride_dyn, stride_yn, 0, n_cols, LOG, BLOCK_N)
    _write_grad(dy_row, y_row, DX + row * n_cols, stride_dyn, stride_yn, 0, n_cols, dot, LOG, BLOCK_N)


@triton.jit
def _slice_bounds(n_cols, slice_cols):
    row = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1) * slice_cols
    hi = tl.minimum(lo + slice_cols, n_cols)
    return row, lo, hi


@triton.jit
def _softmax_slice_stats_kernel(
    X, PMAX, PSUM, n_cols, stride_xm, stride_xn, n_slices, slice_cols, BLOCK_N: tl.constexpr,
):
    """The slice's max and its sum of ``exp(x - max)`` (0 when the slice is all -inf)."""
    row, lo, hi = _slice_bounds(n_cols, slice_cols)
    slice_max, slice_sum = _max_and_sum_exp(X + row * stride_xm, stride_xn, lo, hi, BLOCK_N)
    out = row * n_slices + tl.program_id(1)
    tl.store(PMAX + out, slice_max)
    tl.store(PSUM + out, slice_sum)


@triton.jit
def _softmax_slice_write_kernel(
    X, Y, PMAX, PSUM, n_cols, stride_xm, stride_xn, n_slices, slice_cols,
    LOG: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Merge the row's slice partials, then write this slice of the output."""
    row, lo, hi = _slice_bounds(n_cols, slice_cols)
    idx = tl.arange(0, BLOCK_S)
    ok = idx < n_slices
    pmax = tl.load(PMAX + row * n_slices + idx, mask=ok, other=float("-inf"))
    psum = tl.load(PSUM + row * n_slices + idx, mask=ok, other=0.0)
    row_max = tl.max(pmax, axis=0)
    ref = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(psum * tl.exp(pmax - ref), axis=0)
    _write_probs(X + row * stride_xm, Y + row * n_cols, stride_xn, lo, hi, row_max, total, LOG, BLOCK_N)


@triton.jit
def _softmax_slice_dot_kernel(
    DY, Y, PDOT, n_cols, stride_dym, stride_dyn, stride_ym, stride_yn, n_slices, slice_cols,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The slice's share of ``sum(dy * y)`` (softmax) or ``sum(dy)`` (log-softmax)."""
    row, lo, hi = _slice_bounds(n_cols, slice_cols)
    dot = _grad_dot(DY + row * stride_dym, Y + row * stride_ym, stride_dyn, stride_yn, lo, hi, LOG, BLOCK_N)
    tl.store(PDOT + row * n_slices + tl.program_id(1), dot)


@triton.jit
def _softmax_slice_grad_kernel(
    DY, Y, DX, PDOT, n_cols, stride_dym, stride_dyn, stride_ym, stride_yn, n_slices, slice_cols,
    LOG: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Sum the row's partial dot products, then write this slice of the input gradient."""
    row, lo, hi = _slice_bounds(n_cols, slice_cols)
    idx = tl.arange(0, BLOCK_S)
    dot = tl.sum(tl.load(PDOT + row * n_slices + idx, mask=idx < n_slices, other=0.0), axis=0)
    _write_grad(DY + row * stride_dym, Y + row * stride_ym, DX + row * n_cols, stride_dyn, stride_yn, lo, hi, dot,
                LOG, BLOCK_N)


_FWD_OP, _BWD_OP = "_softmax, _log_softmax", "_softmax_backward_data, _log_softmax_backward_data"
_STATS = Launcher(_softmax_slice_stats_kernel, ("BLOCK_N",), op=_FWD_OP)
_WRITE = Launcher(_softmax_slice_write_kernel, ("LOG", "BLOCK_S", "BLOCK_N"), op=_FWD_OP)
_DOT = Launcher(_softmax_slice_dot_kernel, ("LOG", "BLOCK_N"), op=_BWD_OP)
_GRAD = Launcher(_softmax_slice_grad_kernel, ("LOG", "BLOCK_S", "BLOCK_N"), op=_BWD_OP)
_FWD_LOOPED = Launcher(_softmax_fwd_looped_kernel, ("LOG", "BLOCK_N"), op=_FWD_OP)
_BWD_LOOPED = Launcher(_softmax_bwd_looped_kernel, ("LOG", "BLOCK_N"), op=_BWD_OP)


def _slices(n: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """``(slice columns, slices per row, chunk)`` for the split-row path."""
    slice_cols = tuning.SOFTMAX_SLICE
    chunk = min(tuning.tile("softmax_slice", dtype, slice_cols).block_n, next_power_of_2(slice_cols))
    return slice_cols, cdiv(n, slice_cols), chunk


PATHS = ("auto", "split", "streamed")


def _path(path: str, n: int, n_slices: int) -> str:
    """The path a row of ``n`` columns (``n_slices`` slices) takes: ``"single"``, ``"split"`` or ``"streamed"``."""
    if path != "auto":
        return path
    if n <= tuning.SOFTMAX_SINGLE_MAX:
        return "single"
    return "split" if n_slices <= tuning.SOFTMAX_MAX_SLICES else "streamed"


def forward(x: torch.Tensor, rows: Rows, out_dtype: torch.dtype, log: bool, path: str = "auto") -> torch.Tensor:
    """(Log-)softmax of each long row of ``x``: a contiguous ``[M, N]`` tensor of ``out_dtype``."""
    m, n = rows.n_rows, rows.n_cols
    y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    strides = (rows.row_stride, rows.col_stride)
    slice_cols, n_slices, chunk = _slices(n, x.dtype)
    taken = _path(path, n, n_slices)
    if taken == "single":
        cfg = tuning.tile("softmax_single", x.dtype, n)
        FWD((m,), (x, y, m, n, *strides), cfg.num_warps, log, 1, cfg.block_n)
    elif taken == "split":
        cfg = tuning.tile("softmax_slice", x.dtype, slice_cols)
        pmax = torch.empty((m, n_slices), dtype=torch.float32, device=x.device)
        psum = torch.empty((m, n_slices), dtype=torch.float32, device=x.device)
        common = (n, *strides, n_slices, slice_cols)
        _STATS((m, n_slices), (x, pmax, psum, *common), cfg.num_warps, chunk)
        _WRITE((m, n_slices), (x, y, pmax, psum, *common), cfg.num_warps, log, next_power_of_2(n_slices), chunk)
    else:
        _FWD_LOOPED((m,), (x, y, n, *strides), LOOP_WARPS, log, LOOP_BLOCK)
    return y


def backward(
    dy: torch.Tensor, dy_rows: Rows, y: torch.Tensor, y_rows: Rows, out_dtype: torch.dtype, log: bool,
    path: str = "auto",
) -> torch.Tensor:
    """Input gradient of (log-)softmax over long rows: a contiguous ``[M, N]`` tensor."""
    m, n = y_rows.n_rows, y_rows.n_cols
    dx = torch.empty((m, n), dtype=out_dtype, device=y.device)
    strides = (dy_rows.row_stride, dy_rows.col_stride, y_rows.row_stride, y_rows.col_stride)
    slice_cols, n_slices, chunk = _slices(n, y.dtype)
    taken = _path(path, n, n_slices)
    if taken == "single":
        cfg = tuning.tile("softmax_single", y.dtype, n)
        BWD((m,), (dy, y, dx, m, n, *strides), cfg.num_warps, log, 1, cfg.block_n)
    elif taken == "split":
        cfg = tuning.tile("softmax_slice", y.dtype, slice_cols)
        pdot = torch.empty((m, n_slices), dtype=torch.float32, device=y.device)
        common = (n, *strides, n_slices, slice_cols)
        _DOT((m, n_slices), (dy, y, pdot, *common), cfg.num_warps, log, chunk)
        _GRAD((m, n_slices), (dy, y, dx, pdot, *common), cfg.num_warps, log, next_power_of_2(n_slices), chunk)
    else:
        _BWD_LOOPED((m,), (dy, y, dx, n, *strides), LOOP_WARPS, log, LOOP_BLOCK)
    return dx
