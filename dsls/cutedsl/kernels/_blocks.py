"""Building blocks the row kernels share: block-wide reductions over one CTA.

A CTA of ``threads`` threads reduces one fp32 value per thread: a butterfly shuffle within each
warp, one slot per warp in shared memory, then every thread sums (or maxes) the warp slots so the
result is known CTA-wide without a second broadcast.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

WARP = 32


@cute.jit
def _block_reduce(
    val: cutlass.Float32, slots: cute.Tensor, threads: cutlass.Constexpr, use_max: cutlass.Constexpr,
) -> cutlass.Float32:
    """The CTA-wide sum (or max) of one value per thread; every thread gets it."""
    if cutlass.const_expr(use_max):
        val = cute.arch.warp_reduction_max(val)
    else:
        val = cute.arch.warp_reduction_sum(val)
    if cute.arch.lane_idx() == 0:
        slots[cute.arch.warp_idx()] = val
    cute.arch.sync_threads()
    out = slots[0]
    for i in cutlass.range_constexpr(1, threads // WARP):
        if cutlass.const_expr(use_max):
            out = cute.arch.fmax(out, slots[i])
        else:
            out = out + slots[i]
    cute.arch.sync_threads()  # the slots are reused by the next reduction
    return out


@cute.jit
def block_sum(val: cutlass.Float32, slots: cute.Tensor, threads: cutlass.Constexpr) -> cutlass.Float32:
    return _block_reduce(val, slots, threads, False)


@cute.jit
def block_max(val: cutlass.Float32, slots: cute.Tensor, threads: cutlass.Constexpr) -> cutlass.Float32:
    return _block_reduce(val, slots, threads, True)


def warp_slots(threads: int) -> cute.Tensor:
    """Shared memory for one fp32 per warp (called inside a kernel)."""
    return cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(threads // WARP))


def chunks(t: cute.Tensor, row, vec: int) -> cute.Tensor:
    """Row ``row`` of a row matrix (or the whole of a vector when ``row`` is None) as
    ``(vec, n // vec)``: column ``c`` is the ``c``-th chunk, loaded with one ``vec``-wide access."""
    line = t if row is None else t[row, None]
    return cute.logical_divide(line, cute.make_layout(vec))


def load_f32(chunk: cute.Tensor, frag: cute.Tensor):
    """One chunk into registers, widened to fp32 (a vector of ``vec`` values)."""
    cute.autovec_copy(chunk, frag)
    return frag.load().to(cutlass.Float32)


def fragment(vec: int, dtype) -> cute.Tensor:
    return cute.make_rmem_tensor(cute.make_layout(vec), dtype)
