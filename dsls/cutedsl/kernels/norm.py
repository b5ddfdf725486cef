"""Layer norm and RMS norm rows: forward and backward, one CTA per row (block) of columns.

Every loop strides over the row with the CTA's threads, so any row length compiles and runs:
short rows leave threads idle, vocabulary-sized rows take several trips through memory (a
cluster-wide kernel that keeps long rows in shared memory is future work). Sums are fp32 and
inputs are converted on load, so fp32, fp16 and bf16 share one program per specialization. The forward
moves 16 bytes per access when the caller found rows and pointers aligned for it (``vec``
specializations); the backward moves one element per access (vectorizing it is future work).

The backward runs ``n_ctas`` CTAs that each take every ``n_ctas``-th row and accumulate the
weight and bias gradients of their rows into their own fp32 row of ``dw_part``/``db_part``; the
host sums those few rows, so no atomics are needed and the result does not depend on timing.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from ._blocks import block_sum, chunks, fragment, load_f32, warp_slots


def forward_program(threads: int, vec: int, rms: bool, has_weight: bool, has_bias: bool):
    """Host entry ``(x, w, b, y, mean, rstd, eps, stream)``; absent parameters get any 1-D tensor.

    Each thread moves ``vec`` contiguous elements per access (16 bytes when the caller checked the
    alignment, else 1); row lengths are multiples of ``vec``.
    """

    @cute.kernel
    def kernel(x: cute.Tensor, w: cute.Tensor, b: cute.Tensor, y: cute.Tensor, mean: cute.Tensor,
               rstd: cute.Tensor, eps: Float32):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        n = x.shape[1]
        slots = warp_slots(threads)
        xr, yr = chunks(x, row, vec), chunks(y, row, vec)
        n_chunks = cute.size(xr, mode=[1])
        xf = fragment(vec, x.element_type)
        pf = fragment(vec, w.element_type)
        yf = fragment(vec, y.element_type)
        mu = Float32(0.0)
        if const_expr(not rms):
            acc = Float32(0.0)
            for c in cutlass.range(tid, n_chunks, threads):
                acc = acc + load_f32(xr[None, c], xf).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            mu = block_sum(acc, slots, threads) / n
            mu = mu + (mu - mu)  # a row holding +-inf has no mean (aten's is NaN); finite means keep
        sq = Float32(0.0)
        for c in cutlass.range(tid, n_chunks, threads):
            d = load_f32(xr[None, c], xf) - mu
            sq = sq + (d * d).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        r = cute.math.rsqrt(block_sum(sq, slots, threads) / n + eps)
        if tid == 0:
            rstd[row] = r
            if const_expr(not rms):
                mean[row] = mu
        wr, br = chunks(w, None, vec), chunks(b, None, vec)
        for c in cutlass.range(tid, n_chunks, threads):
            v = (load_f32(xr[None, c], xf) - mu) * r
            if const_expr(has_weight):
                v = v * load_f32(wr[None, c], pf)
            if const_expr(has_bias):
                v = v + load_f32(br[None, c], pf)
            yf.store(v.to(y.element_type))
            cute.autovec_copy(yf, yr[None, c])

    @cute.jit
    def launch(x: cute.Tensor, w: cute.Tensor, b: cute.Tensor, y: cute.Tensor, mean: cute.Tensor,
               rstd: cute.Tensor, eps: Float32, stream):
        kernel(x, w, b, y, mean, rstd, eps).launch(grid=[x.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)

    return launch


def backward_program(threads: int, rms: bool, has_weight: bool, has_bias: bool):
    """Host entry ``(dy, x, w, mean, rstd, dx, dw_part, db_part, n_ctas, stream)``."""

    @cute.kernel
    def kernel(dy: cute.Tensor, x: cute.Tensor, w: cute.Tensor, mean: cute.Tensor, rstd: cute.Tensor,
               dx: cute.Tensor, dw_part: cute.Tensor, db_part: cute.Tensor, n_ctas: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        n = x.shape[1]
        slots = warp_slots(threads)
        for row in cutlass.range(cta, x.shape[0], n_ctas):
            mu = Float32(0.0)
            if const_expr(not rms):
                mu = mean[row].to(Float32)
            r = rstd[row].to(Float32)
            dot = Float32(0.0)
            gsum = Float32(0.0)
            for j in cutlass.range(tid, n, threads):
                g = dy[row, j].to(Float32)
                if const_expr(has_weight):
                    g = g * w[j].to(Float32)
                dot = dot + g * (x[row, j].to(Float32) - mu) * r
                if const_expr(not rms):
                    gsum = gsum + g
            c1 = block_sum(dot, slots, threads) / n
            c2 = Float32(0.0)
            if const_expr(not rms):
                c2 = block_sum(gsum, slots, threads) / n
            for j in cutlass.range(tid, n, threads):
                d = dy[row, j].to(Float32)
                g = d
                if const_expr(has_weight):
                    g = g * w[j].to(Float32)
                xh = (x[row, j].to(Float32) - mu) * r
                dx[row, j] = (r * (g - xh * c1 - c2)).to(dx.element_type)
                if const_expr(has_weight):
                    dw_part[cta, j] = dw_part[cta, j] + d * xh
                if const_expr(has_bias):
                    db_part[cta, j] = db_part[cta, j] + d

    @cute.jit
    def launch(dy: cute.Tensor, x: cute.Tensor, w: cute.Tensor, mean: cute.Tensor, rstd: cute.Tensor,
               dx: cute.Tensor, dw_part: cute.Tensor, db_part: cute.Tensor, n_ctas: Int32, stream):
        kernel(dy, x, w, mean, rstd, dx, dw_part, db_part, n_ctas).launch(
            grid=[n_ctas, 1, 1], block=[threads, 1, 1], stream=stream
        )

    return launch
