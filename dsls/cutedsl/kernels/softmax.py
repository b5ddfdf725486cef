"""Softmax and log-softmax rows: forward (online max and sum) and backward, one CTA per row.

The forward reads the row twice: once keeping a running max and a sum rescaled to it per thread
(so vocabulary-sized rows need no second statistics pass), once to write. Rows of ``-inf`` entries
give NaN like aten; a ``-inf`` entry in an otherwise finite row contributes zero.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from ._blocks import block_max, block_sum, chunks, fragment, load_f32, warp_slots


def forward_program(threads: int, vec: int, log: bool):
    """Host entry ``(x, y, stream)``; ``y`` may be fp32 for fp16 ``x`` (``half_to_float``).

    Each thread moves ``vec`` contiguous elements per access (see ``norm.forward_program``).
    """

    @cute.kernel
    def kernel(x: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        slots = warp_slots(threads)
        xr, yr = chunks(x, row, vec), chunks(y, row, vec)
        n_chunks = cute.size(xr, mode=[1])
        xf = fragment(vec, x.element_type)
        yf = fragment(vec, y.element_type)
        neg_inf = Float32(float("-inf"))
        m = neg_inf
        s = Float32(0.0)
        for c in cutlass.range(tid, n_chunks, threads):
            v = load_f32(xr[None, c], xf)
            new_m = cute.arch.fmax(m, v.reduce(cute.ReductionOp.MAX, neg_inf, 0))
            if new_m > neg_inf:
                s = s * cute.math.exp(m - new_m) + cute.math.exp(v - new_m).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            m = new_m
        row_max = block_max(m, slots, threads)
        if s > Float32(0.0):
            s = s * cute.math.exp(m - row_max)
        total = block_sum(s, slots, threads)
        shift = row_max + cute.math.log(total)
        inv = Float32(1.0) / total
        for c in cutlass.range(tid, n_chunks, threads):
            v = load_f32(xr[None, c], xf)
            if const_expr(log):
                yf.store((v - shift).to(y.element_type))
            else:
                yf.store((cute.math.exp(v - row_max) * inv).to(y.element_type))
            cute.autovec_copy(yf, yr[None, c])

    @cute.jit
    def launch(x: cute.Tensor, y: cute.Tensor, stream):
        kernel(x, y).launch(grid=[x.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)

    return launch


def backward_program(threads: int, log: bool):
    """Host entry ``(dy, y, dx, stream)``: ``y`` is the forward's output."""

    @cute.kernel
    def kernel(dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        n = y.shape[1]
        slots = warp_slots(threads)
        acc = Float32(0.0)
        for j in cutlass.range(tid, n, threads):
            g = dy[row, j].to(Float32)
            if const_expr(not log):
                g = g * y[row, j].to(Float32)
            acc = acc + g
        total = block_sum(acc, slots, threads)
        for j in cutlass.range(tid, n, threads):
            g = dy[row, j].to(Float32)
            out = y[row, j].to(Float32)
            if const_expr(log):
                dx[row, j] = (g - cute.math.exp(out) * total).to(dx.element_type)
            else:
                dx[row, j] = (out * (g - total)).to(dx.element_type)

    @cute.jit
    def launch(dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, stream):
        kernel(dy, y, dx).launch(grid=[y.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)

    return launch
