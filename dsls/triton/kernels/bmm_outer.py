"""Batched outer product: ``bmm`` with an inner dimension of 1 writes ``a[:, :, 0] x b[:, 0, :]``.

A GEMM library gains nothing from K=1; the op is a pure write of ``B*M*N`` elements, so each
program computes one output tile from two short vectors and stores it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.outer import OuterPlan, plan_outer
from .alloc import new_contiguous
from .launch import Launcher, cast_out


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


_OUTER = Launcher(_outer_kernel, ("BLOCK_M", "BLOCK_N"), fresh=("OUT",), op="bmm")


def run_outer(a: torch.Tensor, c: torch.Tensor, plan: OuterPlan) -> torch.Tensor:
    """``outer`` along a plan from ``ops.bmm``: the layout work was done once, for its key."""
    out = new_contiguous(a, plan.out_shape, a.dtype)
    _OUTER.planned(plan.serial, plan.grid, (a, c, out, *plan.ints), plan.num_warps, plan.block_m, plan.block_n)
    return out


def outer(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a [B, M, 1] @ c [B, 1, N]`` as a contiguous ``[B, M, N]`` tensor (any input strides)."""
    return run_outer(a, c, plan_outer(a, c))
