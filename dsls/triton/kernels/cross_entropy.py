"""Cross-entropy over chunks of logits, the row work of the fused linear cross-entropy.

The chunk loops of ``python_native.ops.cross_entropy_chunks`` compute a chunk of logits with a GEMM
and call these on it:

- ``forward_rows``: one program per token streams its row of logits once (online max and sum of
  exponentials, the target's logit, the row sum for label smoothing) and writes the token's loss
  and log-sum-exp in fp32. Nothing the size of the chunk is written.
- ``backward_rows``: a 2-D grid (rows × column blocks) overwrites each logit with its gradient,
  ``(exp(z - lse) - ε/V - (1 - ε)·[column is the target]) * scale``, in the chunk's own dtype; the
  chunk then feeds the gradient GEMMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.tiles import next_power_of_2
from . import tuning
from .launch import Launcher, cast_out


@triton.jit
def _ce_forward_kernel(
    Z, T, LOSS, LSE, row_stride, n_cols, ignore_index, smoothing,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    z_row = Z + row * row_stride
    cols = tl.arange(0, BLOCK_N)
    run_max = tl.full([BLOCK_N], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_N], tl.float32)
    row_sum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + cols
        ok = offs < n_cols
        z = tl.load(z_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, z)
        # A lane that has seen only padding keeps -inf as its maximum: shift it by 0 instead, so its
        # terms are exp(-inf) = 0 rather than exp(-inf + inf) = nan.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.where(ok, tl.exp(z - shift), 0.0)
        run_max = new_max
        row_sum += tl.where(ok, z, 0.0)
    top = tl.max(run_max, axis=0)
    lse = top + tl.log(tl.sum(run_sum * tl.exp(run_max - top), axis=0))
    t = tl.load(T + row)
    kept = t != ignore_index
    picked = tl.load(z_row + t, mask=kept & (t >= 0) & (t < n_cols), other=0.0).to(tl.float32)
    loss = lse - (1.0 - smoothing) * picked - smoothing * tl.sum(row_sum, axis=0) / n_cols
    tl.store(LOSS + row, tl.where(kept, loss, 0.0))
    tl.store(LSE + row, lse)


@triton.jit
def _ce_backward_kernel(
    Z, T, LSE, SCALE, row_stride, n_cols, col_offset, smooth_share, target_weight,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs < n_cols
    ptrs = Z + row * row_stride + offs
    z = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    lse = tl.load(LSE + row)
    scale = tl.load(SCALE + row)
    t = tl.load(T + row)
    g = tl.exp(z - lse) - smooth_share
    g = tl.where(offs + col_offset == t, g - target_weight, g) * scale
    tl.store(ptrs, cast_out(g, Z.dtype.element_ty), mask=ok)


_FORWARD = Launcher(_ce_forward_kernel, ("BLOCK_N",), op="linear_cross_entropy.forward")
_BACKWARD = Launcher(_ce_backward_kernel, ("BLOCK_N",), op="linear_cross_entropy.backward")


def _block(n_cols: int) -> tuple[int, int]:
    """``(columns per step, warps)``: 16 logits per thread, at most ``CROSS_ENTROPY_BLOCK`` a step."""
    block = min(next_power_of_2(max(n_cols, 1)), tuning.CROSS_ENTROPY_BLOCK)
    return block, max(1, min(8, block // 512))


def forward_rows(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                 loss_out: torch.Tensor, lse_out: torch.Tensor) -> None:
    """Each row's loss (0 where ``target`` is ``ignore_index``) and log-sum-exp, into the fp32 outputs."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    block, warps = _block(n_cols)
    _FORWARD((n_rows,), (logits, target, loss_out, lse_out, logits.stride(0), n_cols, ignore_index,
                         float(label_smoothing)), warps, block)


def backward_rows(logits: torch.Tensor, col_offset: int, vocab: int, target: torch.Tensor, lse: torch.Tensor,
                  scale: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Overwrite ``logits`` (columns ``col_offset..`` of a ``vocab``-wide row) with their gradient."""
    n_rows, n_cols = logits.shape
    if n_rows == 0 or n_cols == 0:
        return logits
    block, warps = _block(n_cols)
    _BACKWARD((n_rows, triton.cdiv(n_cols, block)),
              (logits, target, lse, scale, logits.stride(0), n_cols, col_offset, label_smoothing / vocab,
               1.0 - label_smoothing), warps, block)
    return logits
