"""Rotary position embedding of q and k in one launch, forward and backward, computed in fp32.

With ``x1, x2`` the two halves of a head and ``c1, c2`` / ``s1, s2`` those of its position's cos
and sin rows, the forward writes ``(x1 c1 - x2 s1, x2 c2 + x1 s2)`` (``x * cos + rotate_half(x) *
sin``) and the backward, the transposed rotation, ``(x1 c1 + x2 s2, x2 c2 - x1 s1)``. A program
takes one position (see ``plans.rotary``): its cos and sin rows stay in registers while every
head of q, then of k, is rotated in tiles of ``BLOCK_H`` heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.rotary import RotaryPlan
from .launch import Launcher, cast_out


@triton.jit
def _rotate_heads(
    X, OUT, x_base, o_base, c1, c2, s1, s2, cols, col_ok, half, n_heads, n_inner, sx0, sx1, sxd, so0, so1, sod,
    BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Rotate the ``n_heads`` heads (two dims: ``n_heads / n_inner`` by ``n_inner``) at one position."""
    for start in range(0, n_heads, BLOCK_H):
        heads = start + tl.arange(0, BLOCK_H)
        outer = (heads // n_inner).to(tl.int64)
        inner = (heads % n_inner).to(tl.int64)
        mask = (heads < n_heads)[:, None] & col_ok[None, :]
        x_at = X + (x_base + outer * sx0 + inner * sx1)[:, None] + cols[None, :] * sxd
        x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_at + half * sxd, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        o_at = OUT + (o_base + outer * so0 + inner * so1)[:, None] + cols[None, :] * sod
        tl.store(o_at, cast_out(y1, OUT.dtype.element_ty), mask=mask)
        tl.store(o_at + half * sod, cast_out(y2, OUT.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    Q, K, COS, SIN, QO, KO,
    pn1, q_p0, q_p1, qo_p0, qo_p1, k_p0, k_p1, ko_p0, ko_p1, c_p0, c_p1,
    q_heads, q_inner, q_h0, q_h1, qo_h0, qo_h1,
    k_heads, k_inner, k_h0, k_h1, ko_h0, ko_h1, half, q_d, qo_d, k_d, ko_d, c_d,
    BACKWARD: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    pid = tl.program_id(0)
    p0 = (pid // pn1).to(tl.int64)
    p1 = (pid % pn1).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < half
    c_at = COS + p0 * c_p0 + p1 * c_p1 + cols * c_d
    s_at = SIN + p0 * c_p0 + p1 * c_p1 + cols * c_d
    c1 = tl.load(c_at, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(c_at + half * c_d, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(s_at, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(s_at + half * c_d, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(Q, QO, p0 * q_p0 + p1 * q_p1, p0 * qo_p0 + p1 * qo_p1, c1, c2, s1, s2, cols, col_ok, half,
                  q_heads, q_inner, q_h0, q_h1, q_d, qo_h0, qo_h1, qo_d, BACKWARD, BLOCK_HQ)
    _rotate_heads(K, KO, p0 * k_p0 + p1 * k_p1, p0 * ko_p0 + p1 * ko_p1, c1, c2, s1, s2, cols, col_ok, half,
                  k_heads, k_inner, k_h0, k_h1, k_d, ko_h0, ko_h1, ko_d, BACKWARD, BLOCK_HK)


_ROTARY = Launcher(_rotary_kernel, ("BACKWARD", "BLOCK_HQ", "BLOCK_HK", "BLOCK_HALF"), fresh=("QO", "KO"),
                   op="rotary, rotary_backward")


def run(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: RotaryPlan,
        backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` rotated by the positions' angles (``backward``: by their negatives), along a
    plan from ``plans.rotary``; each result has its operand's shape and the plan's strides and dtype."""
    (q_strides, q_dtype), (k_strides, k_dtype) = plan.q_out, plan.k_out
    q_out = torch.empty_strided(q.shape, q_strides, dtype=q_dtype, device=q.device)
    k_out = torch.empty_strided(k.shape, k_strides, dtype=k_dtype, device=k.device)
    _ROTARY.planned(
        (plan.launch_key, backward), plan.grid, (q, k, cos, sin, q_out, k_out, *plan.args),
        plan.num_warps, backward, plan.block_hq, plan.block_hk, plan.block_half,
    )
    return q_out, k_out
