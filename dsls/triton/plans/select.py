"""Launch plans of the top-k kernels: a tensor seen as rows along one dim, and the stages that
narrow each row down to its ``k`` best elements (no triton import).

Every element becomes one int64 key: its value mapped to an order-preserving int32 in the high
half (NaN above +inf, as aten ranks it; -0.0 and 0.0 equal; inverted for the smallest), and its
column, inverted, in the low half. Keys are unique per row, so selecting the largest keys
selects the ``k`` best values, equal values by lowest column first.

A row no wider than ``ONE_PASS`` is selected by one program. A wider row (a vocabulary) is cut
into chunks whose best ``k`` keys each program writes to a scratch row; further stages do the
same to the scratch rows until one program can select from what is left.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from python_native_dsls.layout import collapse

from .tiles import cdiv, next_power_of_2

# Largest k the kernels select (above it: aten). Large enough for sampling, routing and beams.
K_MAX = 1024
# Up to this k a program takes the row's largest key k times; above it, it sorts its keys.
ITERATIVE_K = 16
# Widest row (or scratch row of candidate keys) one program selects from.
ONE_PASS = 4096
# Columns per program in the stages that cut wide rows; a chunk is at least 4 k wide, so every
# stage shrinks its rows at least fourfold.
CHUNK = 2048
# Keys one program holds (rows x columns) when narrow rows are packed together.
TILE = 4096
# Chunks of one row are a grid axis that CUDA bounds at 65535 programs.
MAX_CHUNKS = 65535
MAX_COLS = 2**31 - 2**20  # columns are int32 in the kernels, with headroom for the last block


class RowsAlong(NamedTuple):
    """A tensor as ``outer x n_cols x inner``: row ``r`` is ``(r // inner, r % inner)``."""

    n_rows: int
    n_cols: int
    inner: int
    outer_stride: int
    inner_stride: int
    col_stride: int


class Stage(NamedTuple):
    """One launch: ``width`` keys per row in, the best ``k`` of each ``block`` columns out."""

    from_x: bool  # keys computed from the input (first stage) or read from the last stage's scratch
    final: bool  # writes values and indices (else a scratch row of n_chunks * k keys)
    width: int
    block: int
    n_chunks: int
    block_m: int  # rows per program
    grid: tuple[int, int]
    num_warps: int


class TopkPlan(NamedTuple):
    """Everything a top-k call needs beyond the tensors, fixed by the layout, k and direction."""

    rows: RowsAlong
    k: int
    largest: bool
    out_shape: tuple[int, ...]
    stages: tuple[Stage, ...]
    sort: bool  # programs sort their keys (k above ITERATIVE_K) rather than take maxima k times
    serial: int  # names the plan's launches to the launcher (stage i: serial + i)


def rows_along(shape: tuple[int, ...], strides: tuple[int, ...], dim: int) -> RowsAlong | None:
    """``shape``/``strides`` as rows along ``dim`` (already wrapped), when the dims before it and
    the dims after it each collapse to one evenly strided axis; else None."""
    outer = collapse(shape[:dim], strides[:dim])
    inner = collapse(shape[dim + 1 :], strides[dim + 1 :])
    if outer is None or inner is None:
        return None
    return RowsAlong(outer[0] * inner[0], shape[dim], inner[0], outer[1], inner[1], strides[dim])


_serials = itertools.count()


def _stage(from_x: bool, final: bool, width: int, block: int, n_rows: int) -> Stage:
    n_chunks = cdiv(width, block)
    block_m = min(max(1, TILE // block), next_power_of_2(n_rows)) if final else 1
    warps = max(1, min(8, block_m * block // 512))
    return Stage(from_x, final, width, block, n_chunks, block_m, (cdiv(n_rows, block_m), n_chunks), warps)


def topk_plan(rows: RowsAlong, k: int, largest: bool, out_shape: tuple[int, ...]) -> TopkPlan | str:
    """The stages of a top-k over ``rows``, or why not (a str) where the kernels cannot take it."""
    if k < 1:
        return f"k = {k} (the kernels take 1 <= k <= {K_MAX})"
    if k > K_MAX:
        return f"k = {k} exceeds the kernels' limit of {K_MAX}"
    if k > rows.n_cols:
        return f"k = {k} exceeds the dim's size {rows.n_cols}"
    if rows.n_rows == 0:
        return "empty input"
    if rows.n_rows > MAX_COLS:  # a program's first row, program_id * BLOCK_M, is int32 until widened
        return f"{rows.n_rows} rows exceed the kernels' int32 row indices (at most {MAX_COLS})"
    if k * rows.inner > MAX_COLS:  # an output's offset within its outer slice, pos * inner, is int32
        return f"k x {rows.inner} elements after the dim exceed the kernels' int32 output offsets (at most {MAX_COLS})"
    if rows.n_cols > MAX_COLS:
        return f"rows of {rows.n_cols} elements exceed the kernels' int32 columns (at most {MAX_COLS})"
    stages, width, from_x = [], rows.n_cols, True
    while width > ONE_PASS:
        stage = _stage(from_x, False, width, max(CHUNK, next_power_of_2(4 * k)), rows.n_rows)
        if stage.n_chunks > MAX_CHUNKS:
            return f"{stage.n_chunks} chunks of a row exceed CUDA's grid limit of {MAX_CHUNKS}"
        stages.append(stage)
        width, from_x = stage.n_chunks * k, False
    stages.append(_stage(from_x, True, width, next_power_of_2(width), rows.n_rows))
    serial = next(_serials)
    for _ in stages[1:]:
        next(_serials)
    return TopkPlan(rows, k, largest, out_shape, tuple(stages), k > ITERATIVE_K, serial)
