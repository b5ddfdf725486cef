"""Layer norm and RMS norm over rows held whole in registers, forward and backward.

Both norms share one kernel pair: RMS norm is layer norm without the mean (``IS_RMS``). Each
program normalizes ``BLOCK_M`` rows at once, so short rows still fill a tile. The RMS norms of
model code (``python_native::rms_norm``) add a weight offset (``1 + weight``) and the casting
rule of Llama-style modules (``CAST_X``: the normalized rows are cast back to the input's dtype,
and ``offset + weight`` rounded to the weight's, before the weight applies); they keep no
statistics (``STATS`` off): their backward recomputes the rows' rstd. The backward
programs are persistent: each walks a strided set of row blocks and keeps its share of the
weight and bias gradients in fp32 registers, written once as a partial sum per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.rows import NormPlan, RmsMode
from .alloc import new_contiguous
from .launch import Launcher, cast_out
from .norm_backward import backward, load_weight  # noqa: F401  (the ops call backward through this module)


@triton.jit
def _norm_fwd_kernel(
    X, W, B, Y, MEAN, RSTD,
    n_rows, n_cols, stride_xm, stride_xn, eps, w_offset,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CAST_X: tl.constexpr, STATS: tl.constexpr,
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
        # A row holding +-inf has no mean (aten's is NaN): inf - inf makes it so, finite means keep.
        mean = mean + (mean - mean)
        xc = tl.where(mask, x - mean[:, None], 0.0)
        if STATS:
            tl.store(MEAN + rows, cast_out(mean, MEAN.dtype.element_ty), mask=row_ok)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
    if STATS:
        tl.store(RSTD + rows, cast_out(rstd, RSTD.dtype.element_ty), mask=row_ok)

    y = xc * rstd[:, None]
    if CAST_X:
        y = cast_out(y, X.dtype.element_ty).to(tl.float32)
    if HAS_W:
        y = y * load_weight(W, cols, col_ok, w_offset, CAST_X)[None, :]
    if HAS_B:
        y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * n_cols + cols[None, :], cast_out(y, Y.dtype.element_ty), mask=mask)


_FWD = Launcher(_norm_fwd_kernel, ("IS_RMS", "HAS_W", "HAS_B", "CAST_X", "STATS", "BLOCK_M", "BLOCK_N"),
               fresh=("Y", "MEAN", "RSTD"), op="native_layer_norm, _fused_rms_norm, python_native rms_norm")


def run_forward(
    x: torch.Tensor, plan: NormPlan, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
    stats_dtype: torch.dtype, rms: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``forward`` along a plan from ``plans.rows.norm_plan``: tile, grid and layouts were worked
    out once for the input's layout."""
    y = torch.empty_like(x) if plan.fresh_like else torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = new_contiguous(x, plan.stat_shape, stats_dtype)
    mean = None if rms else new_contiguous(x, plan.stat_shape, stats_dtype)
    rows = plan.rows
    _FWD.planned(
        (rows, x.dtype, stats_dtype, rms, None if weight is None else weight.dtype, None if bias is None else bias.dtype),
        plan.grid,
        (
            x, x if weight is None else weight, x if bias is None else bias, y,
            rstd if mean is None else mean, rstd, rows.n_rows, rows.n_cols, rows.row_stride, rows.col_stride,
            float(eps), 0.0,
        ),
        plan.num_warps, rms, weight is not None, bias is not None, False, True, plan.block_m, plan.block_n,
    )
    return y, mean, rstd


def run_rms_norm(x: torch.Tensor, plan: NormPlan, weight: torch.Tensor, mode: RmsMode, out_dtype: torch.dtype) -> torch.Tensor:
    """``python_native::rms_norm``'s result along a norm plan: ``out_dtype`` (the input's, or the
    promoted dtype of a Llama-style weight), no statistics kept."""
    if plan.fresh_like and out_dtype == x.dtype:
        y = torch.empty_like(x)
    else:
        y = new_contiguous(x, tuple(x.shape), out_dtype)
    rows = plan.rows
    _FWD.planned(
        (rows, x.dtype, weight.dtype, out_dtype, mode.cast_x, "rms_norm"), plan.grid,
        (x, weight, x, y, x, x, rows.n_rows, rows.n_cols, rows.row_stride, rows.col_stride,
         float(mode.eps), float(mode.offset)),
        plan.num_warps, True, True, False, mode.cast_x, False, plan.block_m, plan.block_n,
    )
    return y
