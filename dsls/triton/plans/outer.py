"""Launch plan of the batched outer-product kernel (``bmm`` with an inner dimension of 1)."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from .tiles import cdiv, next_power_of_2

# Elements of the output one program writes.
_TILE = 4096


class OuterPlan(NamedTuple):
    """One outer-product launch, worked out once per layout and dtype."""

    out_shape: tuple[int, int, int]
    grid: tuple[int]
    ints: tuple[int, ...]  # m, n, the four input strides, tiles along m and n
    num_warps: int
    block_m: int
    block_n: int
    serial: int  # names the launch to the launcher


_serials = itertools.count()


def plan_outer(self: torch.Tensor, mat2: torch.Tensor) -> OuterPlan:
    """Tiles and grid of ``self [B, M, 1] @ mat2 [B, 1, N]``, without the cond's checks."""
    batch, m, n = self.shape[0], self.shape[1], mat2.shape[2]
    block_n = min(256, next_power_of_2(n))
    block_m = min(next_power_of_2(m), max(1, _TILE // block_n))
    tiles_m, tiles_n = cdiv(m, block_m), cdiv(n, block_n)
    ints = (m, n, self.stride(0), self.stride(1), mat2.stride(0), mat2.stride(2), tiles_m, tiles_n)
    warps = 8 if block_m * block_n >= 4096 else 4
    return OuterPlan((batch, m, n), (batch * tiles_m * tiles_n,), ints, warps, block_m, block_n, next(_serials))
