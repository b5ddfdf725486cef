"""Tiles of the row and elementwise kernels: plain integer arithmetic, no triton import.

The ops' conds build launch plans from these at call time, and a cond may run where no kernel
will (under FakeTensor tracing, say), so they must not import triton.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from python_native.speckey import SpecializationCache

from ._layout import MAX_NORM_COLS, Rows

# Widest row a single program holds in registers; longer rows decline (norms) or loop (softmax).
MAX_ROW_BLOCK = MAX_NORM_COLS
# Elements per program for short rows: enough rows are packed together to fill the tile.
ROW_TILE = 2048
# Elements per program for elementwise kernels: 16 per thread at 8 warps.
ELEMENTWISE_BLOCK = 4096
ELEMENTWISE_WARPS = 8


class RowConfig(NamedTuple):
    block_m: int  # rows per program
    block_n: int  # columns per program: the whole row, rounded up to a power of two
    num_warps: int


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (``triton.next_power_of_2`` costs a wrapper call in newer Triton)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints (``triton.cdiv`` costs a wrapper call in newer Triton)."""
    return -(-a // b)


def _build_row_config(n_cols: int, rows_hint: int) -> RowConfig:
    block_n = next_power_of_2(n_cols)
    block_m = min(max(1, ROW_TILE // block_n), rows_hint)
    num_warps = min(16, max(2, block_m * block_n // 512))
    return RowConfig(block_m, block_n, num_warps)


_ROW_CONFIGS: SpecializationCache[RowConfig] = SpecializationCache(_build_row_config)


def row_config(n_rows: int, n_cols: int) -> RowConfig:
    """Tile for a row-wise kernel; ``n_rows`` only caps how many rows share a program."""
    rows_hint = min(next_power_of_2(n_rows), ROW_TILE)
    return _ROW_CONFIGS.get((n_cols, rows_hint), n_cols, rows_hint)


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
