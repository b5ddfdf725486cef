"""Batched outer product: ``bmm`` with an inner dimension of 1 writes ``a[:, :, 0] x b[:, 0, :]``.

A GEMM library gains nothing from K=1; the op is a pure write of ``B*M*N`` elements, so each
program computes one output tile from two short vectors and stores it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from python_native.speckey import SpecializationCache

from .launch import Launcher, cast_out, next_power_of_2

_TILE = 4096  # output elements per program


@triton.jit
def _outer_kernel(
    A, C, OUT, M, N, stride_ab, stride_am, stride_cb, stride_cn, tiles_m, tiles_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    per_batch = tiles_m * tiles_n
    b = (pid // per_batch).to(tl.int64)
    tile = pid % per_batch
    rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    rm = rm.to(tl.int64)
    a = tl.load(A + b * stride_ab + rm * stride_am, mask=m_ok, other=0.0).to(tl.float32)
    c = tl.load(C + b * stride_cb + rn.to(tl.int64) * stride_cn, mask=n_ok, other=0.0).to(tl.float32)
    out = a[:, None] * c[None, :]
    offs = (b * M + rm)[:, None] * N + rn[None, :]
    tl.store(OUT + offs, cast_out(out, OUT.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _build_tile(m_hint: int, n_hint: int) -> tuple[int, int, int]:
    block_n = min(256, n_hint)
    block_m = min(m_hint, max(1, _TILE // block_n))
    return block_m, block_n, 8 if block_m * block_n >= 4096 else 4


_TILES: SpecializationCache[tuple[int, int, int]] = SpecializationCache(_build_tile)


_OUTER = Launcher(_outer_kernel, ("BLOCK_M", "BLOCK_N"))


def outer(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a [B, M, 1] @ c [B, 1, N]`` as a contiguous ``[B, M, N]`` tensor (any input strides)."""
    batch, m, n = a.shape[0], a.shape[1], c.shape[2]
    out = a.new_empty((batch, m, n))
    hints = (next_power_of_2(m), next_power_of_2(n))
    block_m, block_n, warps = _TILES.get(hints, *hints)
    tiles_m, tiles_n = (m + block_m - 1) // block_m, (n + block_n - 1) // block_n
    _OUTER(
        (batch * tiles_m * tiles_n,),
        (a, c, out, m, n, a.stride(0), a.stride(1), c.stride(0), c.stride(2), tiles_m, tiles_n),
        warps, block_m, block_n,
    )
    return out
