"""Launch plans of the scatter-add kernel, which serves ``scatter_add`` and ``index_add`` alike (no triton import).

Both add source elements into rows of the output chosen by an index along ``dim``. The kernel
walks an iteration space (``index``'s shape for ``scatter_add``, ``source``'s for ``index_add``)
seen as ``outer x dim x inner``: each of index, source and output must collapse its dims before
``dim`` and its dims after ``dim`` (sized as the iteration space) to one strided axis each.
``index_add``'s 1-D index is an index whose outer and inner strides are 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from python_native_dsls.layout import collapse

from .layout import MAX_INDEX
from .tiles import cdiv, next_power_of_2

# Dtypes the kernel adds exactly as aten does up to the order of the additions (floats) or exactly
# (integers: wrap-around addition is associative). Half types accumulate in a float32 buffer.
DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64})
ACCUMULATE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
# Elements one program adds; columns of the inner axis per program at most.
TILE = 4096
MAX_BLOCK_INNER = 1024
MAX_INNER = 65535 * MAX_BLOCK_INNER  # the inner tiles are a grid axis that CUDA bounds at 65535


class Axes(NamedTuple):
    """A tensor's strides along the iteration space's three axes."""

    outer: int
    dim: int
    inner: int


class ScatterPlan(NamedTuple):
    """One scatter-add launch, fixed by the layouts, dtypes, ``dim`` and ``alpha``."""

    n_rows: int  # outer x dim of the iteration space
    dim_size: int
    inner: int
    target_size: int  # the output's size along dim: indices must lie in [0, target_size)
    index: Axes
    source: Axes
    out: Axes
    acc_dtype: torch.dtype  # what the kernel adds in: the output's dtype, float32 for half types
    alpha: int | float | None  # None: no scaling
    index_row: bool  # one index per (outer, dim) row: loaded once per row
    spans: tuple[int, int, int]  # bytes from first to past last element: self, index, source
    grid: tuple[int, int]
    num_warps: int
    block_r: int
    block_i: int
    serial: int  # names the launch to the launcher


def axes(sizes: Sequence[int], strides: Sequence[int], dim: int) -> Axes | None:
    """``strides`` along (outer, dim, inner) of an iteration space of ``sizes``; None if they do not collapse."""
    outer = collapse(sizes[:dim], strides[:dim])
    inner = collapse(sizes[dim + 1 :], strides[dim + 1 :])
    if outer is None or inner is None:
        return None
    return Axes(outer[1], strides[dim], inner[1])


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a tensor's first to one past its last (for overlap checks)."""
    return 1 + sum((size - 1) * step for size, step in zip(shape, strides, strict=True)) if all(shape) else 0


_serials = itertools.count()


def scatter_plan(space: Sequence[int], dim: int, target_size: int, index: Axes, source: Axes, out: Axes,
                 dtype: torch.dtype, alpha: int | float | None, spans: tuple[int, ...]) -> ScatterPlan | str:
    """Tiles and grid over an iteration space ``space``, or why not (a str) where the kernel cannot take it."""
    dim_size = space[dim]
    outer = 1
    for size in space[:dim]:
        outer *= size
    inner = 1
    for size in space[dim + 1 :]:
        inner *= size
    if outer * dim_size * inner == 0 or target_size == 0:
        return "empty input"
    if inner > MAX_INNER:
        return f"{inner} elements after dim {dim} exceed the kernel's grid limit of {MAX_INNER}"
    block_i = min(next_power_of_2(inner), MAX_BLOCK_INNER)
    n_rows = outer * dim_size
    if n_rows > MAX_INDEX:  # a program's first row, program_id * BLOCK_R, is int32 until widened
        return f"{n_rows} rows exceed the kernel's int32 row indices (at most {MAX_INDEX})"
    block_r = min(next_power_of_2(n_rows), max(1, TILE // block_i))
    grid = (cdiv(n_rows, block_r), cdiv(inner, block_i))
    warps = max(1, min(8, block_r * block_i // 256))
    index_row = index.inner == 0 or inner == 1
    return ScatterPlan(n_rows, dim_size, inner, target_size, index, source, out, ACCUMULATE.get(dtype, dtype),
                       alpha, index_row, (spans[0], spans[1], spans[2]), grid, warps, block_r, block_i,
                       next(_serials))
