"""Row reductions: sum, mean, max and min of each row, one CTA per row.

Each thread folds its share of the row (``vec`` elements per access) into one fp32 value, and the
CTA combines them with the block reductions of ``_blocks``. The hardware's fmax/fmin drop NaN, so
max and min also count the NaN they meet: a row with any NaN gives NaN, as aten's amax and amin
do. Sums are fp32 whatever the input dtype (aten's accumulation type for fp16 and bf16), and a
mean divides the row's sum by its length once, at the end.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from ._blocks import block_max, block_sum, chunks, fragment, load_f32, warp_slots

KINDS = ("sum", "mean", "max", "min")


def program(threads: int, vec: int, kind: str):
    """Host entry ``(x, y, stream)``: ``y[r]`` is the reduction of row ``r`` of ``x``, in ``y``'s dtype."""
    if kind not in KINDS:
        raise ValueError(f"unknown row reduction {kind!r}; expected one of {list(KINDS)}")
    sums = kind in ("sum", "mean")
    start = 0.0 if sums else (float("-inf") if kind == "max" else float("inf"))

    @cute.kernel
    def kernel(x: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        slots = warp_slots(threads)
        xr = chunks(x, row, vec)
        n_chunks = cute.size(xr, mode=[1])
        xf = fragment(vec, x.element_type)
        acc = Float32(start)
        nans = Float32(0.0)
        for c in cutlass.range(tid, n_chunks, threads):
            v = load_f32(xr[None, c], xf)
            if const_expr(sums):
                acc = acc + v.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            else:
                nan_at = cute.where(v != v, cute.ones_like(v), Float32(0.0))
                nans = nans + nan_at.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                if const_expr(kind == "max"):
                    acc = cute.arch.fmax(acc, v.reduce(cute.ReductionOp.MAX, Float32(start), 0))
                else:
                    acc = cute.arch.fmin(acc, v.reduce(cute.ReductionOp.MIN, Float32(start), 0))
        if const_expr(sums):
            total = block_sum(acc, slots, threads)
            if const_expr(kind == "mean"):
                total = total / Float32(x.shape[1])
        else:
            if const_expr(kind == "max"):
                total = block_max(acc, slots, threads)
            else:
                total = -block_max(-acc, slots, threads)
            if block_sum(nans, slots, threads) > Float32(0.0):
                total = Float32(float("nan"))
        if tid == 0:
            y[row] = total.to(y.element_type)

    @cute.jit
    def launch(x: cute.Tensor, y: cute.Tensor, stream):
        kernel(x, y).launch(grid=[x.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)

    return launch
