"""Top-k along rows, launched stage by stage along the plans of ``plans.select``.

A program loads its keys (computed from the input, or read from the last stage's scratch row),
keeps the best ``k`` of them, best first, and writes them back as keys or, in the final stage, as
values (gathered from the input by column, so NaN payloads and the sign of zero are the input's
own) and int64 indices.

Small ``k``: the row's largest key, taken ``k`` times. Larger ``k``: a bitonic selection over the
keys seen as a hypercube of 2-element axes, one axis per bit of the column: blocks of ``P`` (``k``
rounded up to a power of two) are sorted in alternating directions, then halved repeatedly by
keeping the larger of each pair of blocks elementwise (the best ``P`` of both, in bitonic order)
and merging what is kept back into order. Pairs are exchanged with a max and a min over their
axis, which Triton's interpreter also runs as whole-array operations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.select import TopkPlan
from ..plans.tiles import next_power_of_2
from .alloc import new_contiguous
from .launch import Launcher

_INT64_MIN = tl.constexpr(-(2**63))
_LOW = tl.constexpr(0xFFFFFFFF)  # the low half of a key: its inverted column


@triton.jit
def _low_half():
    return tl.full((), _LOW, tl.int64)  # an int64 constant (the bare literal would be uint32)


@triton.jit
def _keys_of(x, cols, LARGEST: tl.constexpr):
    """Order-preserving int64 keys: the value in the high half, the inverted column in the low."""
    x = x.to(tl.float32)
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties with 0.0, as aten compares them
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = tl.where(x != x, 0x7FFFFFFF, key)  # every NaN above +inf
    if not LARGEST:
        key = ~key
    return (key.to(tl.int64) << 32) | (_low_half() - cols.to(tl.int64))


@triton.jit
def _bit(n_axes: tl.constexpr, axis: tl.constexpr):
    """0 and 1 along ``axis`` of a tensor of ``n_axes`` dims, broadcast along the others."""
    return tl.reshape(tl.arange(0, 2), [1] * axis + [2] + [1] * (n_axes - axis - 1))


@triton.jit
def _exchange(h, axis: tl.constexpr, descending):
    """Order every pair along ``axis``: the larger first where ``descending``, else the smaller."""
    n_axes: tl.constexpr = len(h.shape)
    first = _bit(n_axes, axis) == 0
    return tl.where(first == descending, tl.max(h, axis=axis, keep_dims=True), tl.min(h, axis=axis, keep_dims=True))


@triton.jit
def _direction(n_axes: tl.constexpr, bits: tl.constexpr, b: tl.constexpr):
    """Blocks of ``2**b`` run descending where bit ``b`` of their position is 0, ascending where
    it is 1, so that neighbours pair up into bitonic sequences; a block that is the whole row
    (``b == bits``) runs descending."""
    # One return of one type for both cases (a compiled function cannot return a constexpr on one
    # path and a tensor on the other): the whole row reads bit 0 of the last axis, ORed with True.
    axis: tl.constexpr = n_axes - 1 - b * (b < bits)
    return (_bit(n_axes, axis) == 0) | (b == bits)


@triton.jit
def _best_sorted(keys, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, P: tl.constexpr):
    """The ``P`` largest keys of each row of ``keys`` ([BLOCK_M, BLOCK]), largest first: [BLOCK_M, P]."""
    n: tl.constexpr = BLOCK.bit_length() - 1
    p: tl.constexpr = P.bit_length() - 1
    # Axis 0 holds the rows; axis 1 + i holds bit n - 1 - i of the column (bit b: axis n - b).
    h = tl.reshape(keys, [BLOCK_M] + [2] * n)
    for s in tl.static_range(1, p + 1):
        for t in tl.static_range(s):
            h = _exchange(h, n - (s - 1 - t), _direction(n + 1, n, s))
    # Round r leaves n - 1 - r column bits once it halves the blocks (written out, not named: a
    # constexpr cannot be reassigned in a compiled loop).
    for r in tl.static_range(n - p):
        h = tl.max(h, axis=n - r - p)  # block pairs differ in bit p: keep the larger of each pair
        for t in tl.static_range(p):
            h = _exchange(h, n - 1 - r - (p - 1 - t), _direction(n - r, n - 1 - r, p))
    return tl.reshape(h, [BLOCK_M, P])


@triton.jit
def _emit(key, pos, rows, row_ok, keep_ok, chunk, X, KEYS_OUT, VALUES, INDICES, base, col_stride, inner, n_chunks, k,
          FINAL: tl.constexpr):
    """Write the ``pos``-th best keys of ``rows`` (``key`` and ``pos`` broadcast together)."""
    mask = row_ok & keep_ok
    if FINAL:
        col = _low_half() - (key & _low_half())
        value = tl.load(X + base + col * col_stride, mask=mask)
        out = (rows // inner) * (k * inner) + pos * inner + rows % inner
        tl.store(VALUES + out, value, mask=mask)
        tl.store(INDICES + out, col, mask=mask)
    else:
        tl.store(KEYS_OUT + rows * (n_chunks * k) + chunk * k + pos, key, mask=mask)


@triton.jit
def _topk_kernel(
    X, KEYS_IN, KEYS_OUT, VALUES, INDICES,
    n_rows, width, inner, outer_stride, inner_stride, col_stride, n_chunks, k,
    FROM_X: tl.constexpr, FINAL: tl.constexpr, LARGEST: tl.constexpr, SORT: tl.constexpr, K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
):
    chunk = tl.program_id(1)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = rows < n_rows
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = row_ok[:, None] & (cols < width)[None, :]
    base = (rows // inner) * outer_stride + (rows % inner) * inner_stride
    if FROM_X:
        x = tl.load(X + base[:, None] + cols[None, :].to(tl.int64) * col_stride, mask=mask, other=0.0)
        keys = tl.where(mask, _keys_of(x, cols[None, :], LARGEST), _INT64_MIN)
    else:
        keys = tl.load(KEYS_IN + rows[:, None] * width + cols[None, :], mask=mask, other=_INT64_MIN)
    if SORT:
        keys = _best_sorted(keys, BLOCK_M, BLOCK, K)
        pos = tl.arange(0, K)
        _emit(keys, pos[None, :], rows[:, None], row_ok[:, None], (pos < k)[None, :], chunk, X, KEYS_OUT, VALUES,
              INDICES, base[:, None], col_stride, inner, n_chunks, k, FINAL)
    else:
        for i in tl.static_range(K):
            best = tl.max(keys, axis=1)
            _emit(best, i, rows, row_ok, True, chunk, X, KEYS_OUT, VALUES, INDICES, base, col_stride, inner,
                  n_chunks, k, FINAL)
            keys = tl.where(keys == best[:, None], _INT64_MIN, keys)


# Every pointer but the input is allocated per call (placeholders are the fresh values tensor).
TOPK = Launcher(_topk_kernel, ("FROM_X", "FINAL", "LARGEST", "SORT", "K", "BLOCK_M", "BLOCK"),
                fresh=("KEYS_IN", "KEYS_OUT", "VALUES", "INDICES"))


def run_topk(x: torch.Tensor, plan: TopkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of the best ``plan.k`` elements of each row of ``x``, best first:
    contiguous tensors of ``plan.out_shape``, ``x``'s dtype and int64."""
    rows, k, largest, out_shape, stages, sort, serial = plan
    values = new_contiguous(x, out_shape, x.dtype)
    indices = new_contiguous(x, out_shape, torch.int64)
    keys_in = keys_out = values  # placeholders where a stage reads or writes no keys
    for i, stage in enumerate(stages):
        if not stage.final:
            keys_out = new_contiguous(x, (rows.n_rows, stage.n_chunks * k), torch.int64)
        TOPK.planned(
            serial + i, stage.grid,
            (x, keys_in, keys_out, values, indices, rows.n_rows, stage.width, rows.inner, rows.outer_stride,
             rows.inner_stride, rows.col_stride, stage.n_chunks, k),
            stage.num_warps, stage.from_x, stage.final, largest, sort, next_power_of_2(k) if sort else k, stage.block_m,
            stage.block,
        )
        keys_in = keys_out
    return values, indices
