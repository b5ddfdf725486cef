"""Launch plans of the reductions over one dim (sum, mean, prod, max, min, and the arg forms).

A reduction over ``dim`` sees its input as three strided axes: ``outer`` (the dims before ``dim``),
``reduced`` and ``inner`` (the dims after it), each of which must collapse to one evenly strided
axis. With no inner axis (the last dim, or only size-1 dims after it) the reduced axis is a row:
the row kernel packs short rows and steps along long ones. Otherwise the column kernel walks the
reduced axis over tiles of inner columns. Either way, when the kept positions leave too few
programs to fill a GPU and the reduced axis is long, it is cut into slices reduced separately
(per-slice partials in the accumulator's dtype, with their indices for arg reductions), and a
second launch reduces the slices: no atomics, so results do not depend on scheduling.

Everything here is integer arithmetic on metadata: no triton import, FakeTensor safe.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from python_native_dsls.layout import collapse

from .layout import MAX_INDEX
from .tiles import cdiv, next_power_of_2

# Op codes shared with the kernels (``OP`` constexpr).
SUM, MEAN, PROD, MAX, MIN = range(5)

# Fewer programs than this leave an H100's SMs (132) without a second wave to hide latency: a long
# reduced axis is then split into slices.
TARGET_PROGRAMS = 256
# The shortest stretch of a reduced axis worth a program of its own on the split path.
MIN_SLICE = 8192
# Elements a program holds per step: 8 per thread at 16 warps (half that for arg reductions,
# which carry an int64 index per element).
STEP = 4096
# Inner columns per program of the column kernel (16-bit rows: 256 bytes, two full lines).
INNER_BLOCK = 128
# Grid dims y and z of a CUDA launch.
MAX_GRID_YZ = 65535


class ReduceView(NamedTuple):
    """A tensor as ``outer x reduced x inner`` strided axes."""

    n_outer: int
    n_red: int
    n_inner: int
    outer_stride: int
    red_stride: int
    inner_stride: int


class Stage(NamedTuple):
    """One launch: grid, warps and the two tile sizes (row kernel: rows and columns per step;
    column kernel: reduced positions per step and inner columns)."""

    grid: tuple[int, ...]
    num_warps: int
    block_a: int
    block_b: int


class ReducePlan(NamedTuple):
    """A reduction's launches, worked out once per layout, op and dtypes."""

    op: int  # SUM, MEAN, PROD, MAX, MIN
    view: ReduceView
    out_shape: tuple[int, ...]
    values_dtype: torch.dtype | None  # dtype of the values output; None: none is returned
    with_index: bool  # the op returns (or needs, for argmax/argmin) the index of the chosen element
    cast_dtype: torch.dtype | None  # elements are cast to this first (``dtype=``), None: read as they are
    acc_dtype: torch.dtype  # what the kernel accumulates (or compares) in
    rows: bool  # the row kernel (no inner axis) or the column kernel
    n_slices: int  # > 1: the split path (partials, then a second launch)
    slice_len: int
    first: Stage
    second: Stage | None  # the launch reducing the slices' partials
    serial: int  # unique per plan: ``2 * serial + stage`` names a launch to the launcher


def reduce_view(t: torch.Tensor, dim: int) -> ReduceView | None:
    """``t`` as (outer, reduced, inner) axes for a reduction over ``dim`` (normalized), or None."""
    sizes, strides = tuple(t.shape), t.stride()
    outer = collapse(sizes[:dim], strides[:dim])
    inner = collapse(sizes[dim + 1 :], strides[dim + 1 :])
    if outer is None or inner is None:
        return None
    return ReduceView(outer[0], sizes[dim], inner[0], outer[1], strides[dim], inner[1])


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16- and 32-bit floats, fp64 for fp64, int64 for integers and bools."""
    if dtype == torch.float64:
        return torch.float64
    return torch.float32 if dtype.is_floating_point else torch.int64


def _row_stage(n_rows: int, n_cols: int, with_index: bool, n_slices: int) -> Stage:
    step = STEP // 2 if with_index else STEP
    block_n = min(next_power_of_2(n_cols), step)
    block_m = min(max(1, step // block_n), next_power_of_2(n_rows))
    warps = max(1, min(16, block_m * block_n // 256))
    return Stage((cdiv(n_rows, block_m), n_slices), warps, block_m, block_n)


def _col_stage(v: ReduceView, red_span: int, with_index: bool, n_slices: int) -> Stage:
    block_i = min(next_power_of_2(v.n_inner), INNER_BLOCK // 2 if with_index else INNER_BLOCK)
    block_r = min(max(1, (STEP // 2) // block_i), next_power_of_2(red_span))
    warps = max(1, min(8, block_r * block_i // 256))
    return Stage((v.n_outer, cdiv(v.n_inner, block_i), n_slices), warps, block_r, block_i)


def _slicing(kept_programs: int, n_red: int, step: int, width: int) -> tuple[int, int]:
    """``(slices, slice length)``: one slice unless the kept positions leave programs idle and the
    reduced axis is long (a slice covers at least ``MIN_SLICE`` elements of ``width`` columns);
    slice lengths are whole steps."""
    shortest = max(step, cdiv(MIN_SLICE, width))
    if kept_programs >= TARGET_PROGRAMS or n_red < 2 * shortest:
        return 1, n_red
    slices = min(n_red // shortest, cdiv(TARGET_PROGRAMS, kept_programs))
    length = cdiv(cdiv(n_red, slices), step) * step
    return cdiv(n_red, length), length


_serials = itertools.count()


def reduce_plan(
    op: int, v: ReduceView, out_shape: tuple[int, ...], values_dtype: torch.dtype | None, with_index: bool,
    cast_dtype: torch.dtype | None, acc_dtype: torch.dtype,
) -> ReducePlan | str:
    """The launches for ``v``, or why not (a str) where the kernels' index arithmetic or grid would overflow."""
    if not (v.n_red > 0 and v.n_outer > 0 and v.n_inner > 0):
        return "empty input"
    if v.n_outer > MAX_INDEX:  # a program's first outer index, program_id * BLOCK, is int32
        return f"{v.n_outer} outer rows exceed the kernels' int32 row indices (at most {MAX_INDEX})"
    if v.n_red > MAX_INDEX:
        return f"a reduced dim of {v.n_red} elements exceeds the kernels' int32 offsets"
    if (v.n_red - 1) * v.red_stride > MAX_INDEX and v.n_inner == 1:  # the row kernel's in-row offsets are int32
        return f"in-row offsets exceed int32: {v.n_red} elements {v.red_stride} apart"
    if (v.n_inner - 1) * v.inner_stride > MAX_INDEX:
        return f"inner offsets exceed int32: {v.n_inner} columns {v.inner_stride} apart"
    serial = next(_serials)
    if v.n_inner == 1:
        first = _row_stage(v.n_outer, v.n_red, with_index, 1)
        n_slices, length = _slicing(first.grid[0], v.n_red, first.block_b, 1)
        if n_slices == 1:
            return ReducePlan(op, v, out_shape, values_dtype, with_index, cast_dtype, acc_dtype, True, 1, v.n_red,
                              first, None, serial)
        first = Stage((v.n_outer, n_slices), first.num_warps, 1, first.block_b)
        second = _row_stage(v.n_outer, n_slices, with_index, 1)
        return ReducePlan(op, v, out_shape, values_dtype, with_index, cast_dtype, acc_dtype, True, n_slices, length,
                          first, second, serial)
    first = _col_stage(v, v.n_red, with_index, 1)
    if first.grid[1] > MAX_GRID_YZ:
        return f"{first.grid[1]} blocks of inner columns exceed CUDA's grid limit of {MAX_GRID_YZ}"
    n_slices, length = _slicing(first.grid[0] * first.grid[1], v.n_red, first.block_a, first.block_b)
    if n_slices == 1:
        return ReducePlan(op, v, out_shape, values_dtype, with_index, cast_dtype, acc_dtype, False, 1, v.n_red,
                          first, None, serial)
    first = first._replace(grid=(*first.grid[:2], n_slices))
    partials = ReduceView(v.n_outer, n_slices, v.n_inner, n_slices * v.n_inner, v.n_inner, 1)
    second = _col_stage(partials, n_slices, with_index, 1)
    return ReducePlan(op, v, out_shape, values_dtype, with_index, cast_dtype, acc_dtype, False, n_slices, length,
                      first, second, serial)
