"""Dropout masks from a counter-based generator (Philox), applied in the same pass.

Each call gets one 64-bit Philox key, drawn from torch's generator by ``draw_seed`` (one element
of ``Tensor.random_`` on the input's device), and the kernels read it from device memory. So
``torch.manual_seed`` reproduces a run, the generator advances once per call as for any torch
random op, and under CUDA graph capture the draw is itself captured (torch's CUDA generator hands
captured random ops a fresh offset on every replay), so a replayed graph draws fresh masks:
nothing random is baked into the launch.

Element ``i`` of a flat launch takes 24 random bits from counter ``i mod BLOCK/4`` of its program
(``tl.randint4x`` gives four 32-bit words per counter): program ``k`` serves elements
``k*BLOCK + j*BLOCK/4 + i`` from word ``j`` of counter ``k*BLOCK/4 + i``. An element is kept when
its bits are at least ``round(p * 2**24)``: probability ``1 - p`` to within ``2**-25``, exactly 1
at ``p = 0`` and exactly 0 at ``p = 1``. The bits differ from aten's (which runs its own Philox
layout through curand): the contract (a bool mask, ``x * mask * scale``) is aten's, the stream is not.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.elementwise import ElementwisePlan
from ..plans.tiles import ELEMENTWISE_BLOCK
from .alloc import new_contiguous
from .launch import Launcher, cast_out

RANDOM_BITS = 24  # bits per element compared with the threshold
# 4 warps over 4096 elements: each thread holds 8 adjacent elements of each quarter of the block
# (one 16-byte vector of a 16-bit dtype, two of fp32), 32 in all.
WARPS = 4


def threshold(p: float) -> int:
    """The 24-bit threshold below which an element's bits fall with probability ``p``."""
    return min(max(round(p * (1 << RANDOM_BITS)), 0), 1 << RANDOM_BITS)


def draw_seed(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A Philox key: one int64 drawn from ``generator`` (the default generator of ``like``'s device
    when None), as a one-element tensor on that device."""
    return new_contiguous(like, (1,), torch.int64).random_(generator=generator)


@triton.jit
def _bits(SEED, BLOCK: tl.constexpr):
    """Four vectors of ``BLOCK/4`` 24-bit random integers for this program (see the module docstring)."""
    quarter: tl.constexpr = BLOCK // 4
    seed = tl.load(SEED)
    r0, r1, r2, r3 = tl.randint4x(seed, tl.program_id(0) * quarter + tl.arange(0, quarter))
    return (r0 >> 8).to(tl.int32), (r1 >> 8).to(tl.int32), (r2 >> 8).to(tl.int32), (r3 >> 8).to(tl.int32)


@triton.jit
def _drop(X, Y, MASK, offsets, bits, n, limit, scale):
    ok = offsets < n
    keep = bits >= limit
    x = tl.load(X + offsets, mask=ok, other=0.0).to(tl.float32)
    # x * mask * scale, as aten: a dropped NaN or infinity stays NaN.
    tl.store(Y + offsets, cast_out(x * keep.to(tl.float32) * scale, Y.dtype.element_ty), mask=ok)
    tl.store(MASK + offsets, keep, mask=ok)


@triton.jit
def _dropout_kernel(X, Y, MASK, SEED, n, limit, scale, BLOCK: tl.constexpr):
    b0, b1, b2, b3 = _bits(SEED, BLOCK)
    quarter: tl.constexpr = BLOCK // 4
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, quarter)
    _drop(X, Y, MASK, offsets, b0, n, limit, scale)
    _drop(X, Y, MASK, offsets + quarter, b1, n, limit, scale)
    _drop(X, Y, MASK, offsets + 2 * quarter, b2, n, limit, scale)
    _drop(X, Y, MASK, offsets + 3 * quarter, b3, n, limit, scale)


@triton.jit
def _fill(OUT, offsets, bits, n, limit):
    tl.store(OUT + offsets, cast_out((bits < limit).to(tl.float32), OUT.dtype.element_ty), mask=offsets < n)


@triton.jit
def _bernoulli_kernel(OUT, SEED, n, limit, BLOCK: tl.constexpr):
    """``OUT[i] = 1`` with probability ``limit / 2**24``, else 0."""
    b0, b1, b2, b3 = _bits(SEED, BLOCK)
    quarter: tl.constexpr = BLOCK // 4
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, quarter)
    _fill(OUT, offsets, b0, n, limit)
    _fill(OUT, offsets + quarter, b1, n, limit)
    _fill(OUT, offsets + 2 * quarter, b2, n, limit)
    _fill(OUT, offsets + 3 * quarter, b3, n, limit)


@triton.jit
def _masked_scale_kernel(DY, MASK, DX, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < n
    dy = tl.load(DY + offsets, mask=ok, other=0.0).to(tl.float32)
    keep = tl.load(MASK + offsets, mask=ok, other=0)
    tl.store(DX + offsets, cast_out(dy * keep.to(tl.float32) * scale, DX.dtype.element_ty), mask=ok)


_DROPOUT = Launcher(_dropout_kernel, ("BLOCK",), fresh=("Y", "MASK", "SEED"))
_BERNOULLI = Launcher(_bernoulli_kernel, ("BLOCK",), fresh=("SEED",))
_MASKED_SCALE = Launcher(_masked_scale_kernel, ("BLOCK",), fresh=("DX",))


def run_dropout(
    x: torch.Tensor, plan: ElementwisePlan, seed: torch.Tensor, p: float, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x * mask * scale, mask)`` with ``mask`` a bool tensor kept with probability ``1 - p``, both
    laid out like ``x`` (which must be dense)."""
    y = torch.empty_like(x)
    mask = torch.empty_like(x, dtype=torch.bool)
    limit = threshold(p)
    _DROPOUT.planned(
        (plan.launch_key, limit), plan.grid, (x, y, mask, seed, plan.n, limit, scale),
        WARPS, ELEMENTWISE_BLOCK,
    )
    return y, mask


def run_bernoulli(out: torch.Tensor, plan: ElementwisePlan, seed: torch.Tensor, p: float) -> torch.Tensor:
    """Fill the dense ``out`` with ones (probability ``p``) and zeros, in place; returns ``out``."""
    limit = threshold(p)
    _BERNOULLI.planned((plan.launch_key, limit), plan.grid, (out, seed, plan.n, limit),
                       WARPS, ELEMENTWISE_BLOCK)
    return out


def run_masked_scale(
    dy: torch.Tensor, mask: torch.Tensor, plan: ElementwisePlan, scale: float, out: torch.Tensor,
) -> torch.Tensor:
    """``out = dy * mask * scale``; ``dy``, ``mask`` and ``out`` dense with identical strides."""
    _MASKED_SCALE.planned(plan.launch_key, plan.grid, (dy, mask, out, plan.n, float(scale)),
                          WARPS, ELEMENTWISE_BLOCK)
    return out
