"""Launch plans of the group norm kernels: the input seen as ``N x C x HW``, tiles, splits and grids.

Group norm normalizes each ``(sample, group)`` over its ``C/G`` channels and every spatial
position. The kernels address the input through one stride per axis of ``N x C x HW``: in a
contiguous (NCHW) tensor a group is one contiguous run; in a channels-last one (NHWC, NDHWC) it is
``C/G`` adjacent channels at every position. Tiles are laid along the contiguous axis first
(spatial positions in NCHW, channels in NHWC) so that loads are whole vectors either way.

A group can be far longer than a register tile (``32 x 64 x 64`` elements in a diffusion U-Net),
so its statistics are gathered by several programs ("splits"), each streaming a share of the
group's tiles and leaving a partial (count, mean, sum of squared deviations); they are combined
exactly (Chan's pairwise update) before the normalization pass, which is then a plain tiled
elementwise launch. The backward follows the same split: per-channel partial sums, per-group
coefficients, per-channel parameter gradients, then the elementwise input gradient.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch

from python_native_dsls.constants import sm_count
from python_native_dsls.layout import FLOAT_DTYPES, collapse

from .layout import MAX_INDEX
from .tiles import cdiv, next_power_of_2

# Elements a program holds per step: 8 KB of a 16-bit tensor, 8 KB of an fp32 one.
TILE = {torch.float32: 2048, torch.float16: 4096, torch.bfloat16: 4096}
# Most programs sharing one group's statistics (the combine holds their partials in one vector).
MAX_SPLITS = 64
# Programs wanted per SM for the statistics passes; under the interpreter, a fixed few.
PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 4
WARPS = 8

_serials = itertools.count()
_FLOATS = ", ".join(sorted(str(d).removeprefix("torch.") for d in FLOAT_DTYPES))


class ChannelView(NamedTuple):
    """A tensor as ``N x C x HW`` with one stride per axis."""

    n: int
    c: int
    hw: int
    stride_n: int
    stride_c: int
    stride_hw: int


class Tile(NamedTuple):
    """A ``block_c x block_hw`` tile (channels x spatial positions)."""

    block_c: int
    block_hw: int


class GroupNormPlan(NamedTuple):
    """Everything a forward or backward launch needs beyond the tensors, fixed by the input's layout."""

    view: ChannelView  # the input's (and the output's: ``empty_like`` keeps its format)
    groups: int
    group_channels: int
    channels_last: bool
    stat_shape: tuple[int, int]
    # statistics: ``splits`` programs per group, each streaming ``per_split`` tiles of ``stats_tile``
    stats_tile: Tile
    hw_tiles: int  # tiles along the spatial axis of one group
    group_tiles: int
    splits: int
    per_split: int
    # elementwise passes (normalization, input gradient): ``elem_tile`` over one sample's C x HW
    elem_tile: Tile
    elem_grid: tuple[int]
    c_blocks: int
    hw_blocks: int
    # backward channel sums, on ``elem_tile``: ``sum_splits`` programs per channel block of a
    # sample, ``sum_per_split`` spatial tiles each
    sum_splits: int
    sum_per_split: int
    serial: int  # unique per plan: names its launches to the launchers


def _tile(dtype: torch.dtype, channels: int, positions: int, channels_last: bool) -> Tile:
    """The tile over ``channels x positions``, filled along the contiguous axis first."""
    size = TILE[dtype]
    if channels_last:
        block_c = min(next_power_of_2(channels), size)
        return Tile(block_c, max(1, min(next_power_of_2(positions), size // block_c)))
    block_hw = min(next_power_of_2(positions), size)
    return Tile(max(1, min(next_power_of_2(channels), size // block_hw)), block_hw)


@functools.lru_cache(maxsize=16)
def programs_wanted(device_index: int) -> int:
    """Programs that keep every SM of a CUDA device busy (-1, a CPU tensor: the interpreter's few)."""
    if device_index < 0:
        return INTERPRETER_PROGRAMS
    return PROGRAMS_PER_SM * sm_count(device_index)


def _splits(work_items: int, tiles: int, wanted: int) -> tuple[int, int]:
    """``(splits, tiles per split)`` sharing ``tiles`` per work item so that about ``wanted`` programs run."""
    splits = max(1, min(tiles, MAX_SPLITS, cdiv(wanted, work_items)))
    per_split = cdiv(tiles, splits)
    return cdiv(tiles, per_split), per_split


def _memory_format(x: torch.Tensor) -> torch.memory_format | None:
    """The format aten lays group norm's output out in (``suggest_memory_format``), when ``x`` is
    dense in it; None otherwise (aten's kernels then take or reject the call)."""
    from torch._prims_common import suggest_memory_format

    fmt = suggest_memory_format(x)
    return fmt if x.is_contiguous(memory_format=fmt) else None


def plan_or_why(x: torch.Tensor, n: int, c: int, hw: int, groups: int, device_index: int) -> GroupNormPlan | str:
    """The plan where the kernels take ``x`` with these size arguments, else why not (a str)."""
    found = shape_why(x, n, c, hw, groups)
    if found:
        return found
    fmt = _memory_format(x)
    if fmt is None:
        return "layout: not dense in the memory format aten gives the output (contiguous or channels-last)"
    channels_last = fmt in (torch.channels_last, torch.channels_last_3d)
    view = ChannelView(n, c, hw, hw * c, 1, c) if channels_last else ChannelView(n, c, hw, c * hw, hw, 1)
    cg = c // groups
    wanted = programs_wanted(device_index)
    stats_tile = _tile(x.dtype, cg, hw, channels_last)
    hw_tiles = cdiv(hw, stats_tile.block_hw)
    group_tiles = cdiv(cg, stats_tile.block_c) * hw_tiles
    splits, per_split = _splits(n * groups, group_tiles, wanted)
    elem_tile = _tile(x.dtype, c, hw, channels_last)
    c_blocks, hw_blocks = cdiv(c, elem_tile.block_c), cdiv(hw, elem_tile.block_hw)
    sum_splits, sum_per_split = _splits(n * c_blocks, hw_blocks, wanted)
    # Per-group statistics (3 per group; 4 partials per split), the backward's channel partials (2 per
    # split) and every grid's program ids are int32 in the kernels, samples aside.
    largest = max(4 * n * groups * splits, 2 * n * c * sum_splits, n * c_blocks * hw_blocks)
    if largest > MAX_INDEX:
        return f"N = {n}: the kernels' statistics, partial sums or program ids would pass int32 ({largest} > {MAX_INDEX})"
    return GroupNormPlan(
        view, groups, cg, channels_last, (n, groups), stats_tile, hw_tiles, group_tiles, splits, per_split,
        elem_tile, (n * c_blocks * hw_blocks,), c_blocks, hw_blocks, sum_splits, sum_per_split,
        next(_serials),
    )


def shape_why(x: torch.Tensor, n: int, c: int, hw: int, groups: int) -> str | None:
    """Why ``x`` is not a float ``N x C x *`` tensor matching the op's size arguments within the
    kernels' limits (None: it is)."""
    if x.dtype not in FLOAT_DTYPES:
        return f"dtype {str(x.dtype).removeprefix('torch.')} (the kernels take {_FLOATS})"
    if x.ndim < 2:
        return f"a {x.ndim}-d input (the kernels take N x C x *)"
    if groups <= 0:
        return f"group = {groups}"
    if n <= 0 or c <= 0 or hw <= 0:
        return f"empty input (N = {n}, C = {c}, HxW = {hw})"
    if c % groups:
        return f"C = {c} is not divisible by group = {groups}"
    shape = x.shape
    if shape[0] != n or shape[1] != c or x.numel() != n * c * hw:
        return f"N = {n}, C = {c}, HxW = {hw} do not match the input's shape {tuple(shape)}"
    if c * hw > MAX_INDEX:  # in-sample offsets are int32; samples are addressed with int64
        return f"samples of {c * hw} elements exceed the kernels' int32 offsets"
    return None


def group_norm_plan(x: torch.Tensor, n: int, c: int, hw: int, groups: int) -> GroupNormPlan | None:
    """The plan for ``native_group_norm(x, ..., N, C, HxW, group)`` (and its backward) where the
    kernels take ``x``, else None (the ops' conds cache it per layout; this computes it)."""
    plan = plan_or_why(x, n, c, hw, groups, x.get_device())
    return None if plan.__class__ is str else plan


def view_of(t: torch.Tensor, n: int, c: int, hw: int) -> ChannelView | None:
    """``t`` (shaped like the input) as ``N x C x HW`` strides, when its spatial dims collapse to one
    stride (any layout, expanded gradients included) and in-sample offsets fit int32; else None."""
    if t.ndim < 2 or t.shape[0] != n or t.shape[1] != c:
        return None
    strides = t.stride()
    spatial = collapse(t.shape[2:], strides[2:]) if t.ndim > 2 else (1, 1)
    if spatial is None or spatial[0] != hw:
        return None
    if (c - 1) * strides[1] + (hw - 1) * spatial[1] > MAX_INDEX:
        return None
    return ChannelView(n, c, hw, strides[0], strides[1], spatial[1])


# Mirrors ``view_of`` (which stays a bare check: the backward's cond runs it on every call).
def view_why(t: torch.Tensor, n: int, c: int, hw: int, what: str = "grad_out") -> str | None:
    """Why ``view_of(t, n, c, hw)`` is None (None: it is not)."""
    if t.ndim < 2 or t.shape[0] != n or t.shape[1] != c:
        return f"{what} shape {tuple(t.shape)} is not N x C x * with N = {n}, C = {c}"
    strides = t.stride()
    spatial = collapse(t.shape[2:], strides[2:]) if t.ndim > 2 else (1, 1)
    if spatial is None:
        return f"layout: {what}'s spatial dims do not collapse to one stride"
    if spatial[0] != hw:
        return f"{what} has {spatial[0]} spatial positions, not HxW = {hw}"
    if (c - 1) * strides[1] + (hw - 1) * spatial[1] > MAX_INDEX:
        return f"{what}'s in-sample offsets exceed int32"
    return None
