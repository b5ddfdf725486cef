"""Launch plan of the rotary kernel: which dims of q and k are positions and which are heads.

``cos.unsqueeze(unsqueeze_dim)`` broadcast against q splits q's leading dims in two: the dims cos
varies along (positions: batch and sequence) and the dims it is broadcast over (heads, and a
batch that shares one set of positions). A program takes one position, loads its cos and sin
rows once, and rotates every head of q and then of k at that position, in tiles of heads by
half the head dim: cos and sin are read once, q and k once, the results written once.
Positions and heads may each span up to two dims; every operand may have any strides (an
expanded gradient too).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .tiles import next_power_of_2

_TILE = 4096  # elements of q (both halves) per step of a program
_MAX_DIMS = 4


class RotaryPlan(NamedTuple):
    grid: tuple[int]
    args: tuple[int, ...]  # the kernel's integer arguments, in its order
    q_out: tuple[tuple[int, ...], torch.dtype]  # strides and dtype of the rotated q
    k_out: tuple[tuple[int, ...], torch.dtype]
    block_hq: int
    block_hk: int
    block_half: int
    num_warps: int
    launch_key: tuple


def _broadcast_strides(cos: torch.Tensor, unsqueeze_dim: int, shape: torch.Size) -> tuple[list[int], list[int]] | str:
    """Sizes and strides of ``cos.unsqueeze(unsqueeze_dim)`` right-aligned with ``shape``, or why it does not broadcast."""
    if not -cos.ndim - 1 <= unsqueeze_dim <= cos.ndim:
        return f"unsqueeze_dim={unsqueeze_dim} is out of range for cos of {cos.ndim} dims"
    dim = unsqueeze_dim % (cos.ndim + 1)
    sizes, strides = list(cos.shape), list(cos.stride())
    sizes.insert(dim, 1)
    strides.insert(dim, 0)
    if len(sizes) > len(shape):
        return f"cos unsqueezed at {unsqueeze_dim} has {len(sizes)} dims, q {len(shape)}"
    pad = len(shape) - len(sizes)
    sizes, strides = [1] * pad + sizes, [0] * pad + strides
    for i, (size, want) in enumerate(zip(sizes, shape, strict=True)):
        if size != want and size != 1:
            return f"cos unsqueezed at {unsqueeze_dim} (shape {tuple(sizes)}) does not broadcast to q's {tuple(shape)}"
        if size == 1:
            strides[i] = 0
    return sizes, strides


def _out_strides(t: torch.Tensor, dense: bool) -> tuple[int, ...]:
    """``t``'s own strides where it is dense (the result keeps its layout), else contiguous ones."""
    if dense:
        return tuple(t.stride())
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _two(dims: list[int], values: list[int] | tuple[int, ...], pad: int) -> tuple[int, int]:
    """``values`` at ``dims`` (at most two), padded at the front with ``pad``."""
    picked = [values[d] for d in dims]
    return tuple([pad] * (2 - len(picked)) + picked)  # type: ignore[return-value]


def plan_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int,
                dense: tuple[bool, bool]) -> RotaryPlan | str:
    """The launch for rotating ``q`` and ``k`` by ``cos``/``sin`` (``dense``: whether each result
    may keep its operand's layout), or why the kernel cannot take it (metadata only)."""
    if q.ndim != k.ndim or not 2 <= q.ndim <= _MAX_DIMS:
        return f"q and k of {q.ndim} and {k.ndim} dims (the kernel takes 2 to {_MAX_DIMS}, the same for both)"
    width = q.shape[-1]
    if width % 2 or k.shape[-1] != width or cos.shape[-1] != width:
        return (f"head dims q {width}, k {k.shape[-1]}, cos {cos.shape[-1]}: they must be equal and even")
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        return "cos and sin differ in shape or strides"
    broadcast = _broadcast_strides(cos, unsqueeze_dim, q.shape)
    if isinstance(broadcast, str):
        return broadcast
    sizes, c_strides = broadcast
    lead = range(q.ndim - 1)
    positions = [d for d in lead if sizes[d] > 1]
    heads = [d for d in lead if sizes[d] == 1 and (q.shape[d] > 1 or k.shape[d] > 1)]
    if any(k.shape[d] != q.shape[d] for d in positions):
        return f"k's shape {tuple(k.shape)} differs from q's {tuple(q.shape)} along the positions cos varies over"
    if len(positions) > 2 or len(heads) > 2:
        return "cos varies over more than two leading dims, or is broadcast over more than two"
    pn0, pn1 = _two(positions, q.shape, 1)
    q_out, k_out = _out_strides(q, dense[0]), _out_strides(k, dense[1])
    per_position = [_two(positions, s, 0) for s in (q.stride(), q_out, k.stride(), k_out, c_strides)]
    q_heads, k_heads = _two(heads, q.shape, 1), _two(heads, k.shape, 1)
    args = (
        pn1, *[s for pair in per_position for s in pair],
        q_heads[0] * q_heads[1], q_heads[1], *_two(heads, q.stride(), 0), *_two(heads, q_out, 0),
        k_heads[0] * k_heads[1], k_heads[1], *_two(heads, k.stride(), 0), *_two(heads, k_out, 0),
        width // 2, q.stride(-1), q_out[-1], k.stride(-1), k_out[-1], c_strides[-1],
    )
    block_half = next_power_of_2(width // 2)
    rows = max(1, _TILE // (2 * block_half))
    block_hq = min(next_power_of_2(q_heads[0] * q_heads[1]), rows)
    block_hk = min(next_power_of_2(k_heads[0] * k_heads[1]), rows)
    warps = max(1, min(8, 2 * max(block_hq, block_hk) * block_half // 512))
    tables = torch.promote_types(cos.dtype, sin.dtype)
    q_dtype, k_dtype = torch.promote_types(q.dtype, tables), torch.promote_types(k.dtype, tables)
    key = (args, q.dtype, k.dtype, cos.dtype, sin.dtype, q_dtype, k_dtype)
    return RotaryPlan((pn0 * pn1,), args, (q_out, q_dtype), (k_out, k_dtype), block_hq, block_hk, block_half, warps,
                      key)
