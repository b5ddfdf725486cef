"""Launch plans of the row kernels: softmax (``RowPlan``) and the norms (``NormPlan``).

A plan holds everything a launch needs beyond the tensors (rows and strides, tile, grid, how to
allocate the output); the ops' conds build one per layout (and cache it: ``python_native_dsls.family``)
and the kernels launch along it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from python_native_dsls.layout import FLOAT_DTYPES, Rows, as_rows, normalized_axis, stat_shape

from .layout import MAX_NORM_COLS, row_fits
from .tiles import MAX_ROW_BLOCK, cdiv, row_config


class RowPlan(NamedTuple):
    """A softmax launch worked out once per layout and dtypes: all the impl needs beyond the tensors."""

    rows: Rows  # the operand's rows: x forward, y backward
    grad_rows: Rows | None  # backward: dy's rows
    out_dtype: torch.dtype
    fresh_like: bool  # torch.empty_like(operand) already has the output's dtype and row-major layout
    looped: bool  # rows longer than one register block: the long-row kernels, which plan themselves
    grid: tuple[int, ...]
    num_warps: int
    block_m: int
    block_n: int
    serial: int  # even, unique per plan: ``serial + log`` names the launch to the launcher


_serials = itertools.count()


def row_plan(rows: Rows, out_dtype: torch.dtype, fresh_like: bool, grad_rows: Rows | None = None) -> RowPlan:
    serial = 2 * next(_serials)
    if rows.n_cols > MAX_ROW_BLOCK:
        return RowPlan(rows, grad_rows, out_dtype, fresh_like, True, (), 0, 0, 0, serial)
    cfg = row_config(rows.n_rows, rows.n_cols)
    grid = (cdiv(rows.n_rows, cfg.block_m),)
    return RowPlan(rows, grad_rows, out_dtype, fresh_like, False, grid, cfg.num_warps, cfg.block_m, cfg.block_n, serial)


class NormPlan(NamedTuple):
    """How the norm kernels see an input: its rows, the shape of its per-row statistics, and the
    forward launch (tile and grid), all fixed by the input's layout."""

    rows: Rows
    stat_shape: tuple[int, ...]
    param_size: torch.Size  # what a weight or bias must be shaped as
    fresh_like: bool  # the input is contiguous: torch.empty_like(x) is the output's layout
    grid: tuple[int, ...]
    num_warps: int
    block_m: int
    block_n: int


def norm_plan(x: torch.Tensor, normalized_shape: Sequence[int], max_cols: int = MAX_NORM_COLS) -> NormPlan | None:
    """The plan for a float ``x`` normalized over its trailing ``normalized_shape``, when the
    single-block norm kernels handle its rows (up to ``max_cols`` long), else None. The ops cache
    it per layout (their conds); this computes it."""
    if x.dtype not in FLOAT_DTYPES:
        return None
    axis = normalized_axis(x, normalized_shape)
    if axis is None:
        return None
    rows = as_rows(x, len(normalized_shape))
    if not row_fits(rows) or rows.n_cols > max_cols:
        return None
    if rows.n_cols > MAX_ROW_BLOCK:  # the backward streams such rows; no forward launch to plan
        grid, warps, block_m, block_n = (), 0, 0, 0
    else:
        cfg = row_config(rows.n_rows, rows.n_cols)
        grid, warps, block_m, block_n = (cdiv(rows.n_rows, cfg.block_m),), cfg.num_warps, cfg.block_m, cfg.block_n
    return NormPlan(rows, tuple(stat_shape(x, axis)), torch.Size(tuple(normalized_shape)), x.is_contiguous(), grid,
                    warps, block_m, block_n)


class RmsMode(NamedTuple):
    """How ``python_native::rms_norm`` applies its weight: ``offset + weight`` (Gemma's ``1 +
    weight``), and ``cast_x`` for Llama's rule (the normalized rows cast back to the input's dtype
    and the shifted weight rounded to its own before they multiply; else both stay in fp32)."""

    eps: float
    offset: float
    cast_x: bool
