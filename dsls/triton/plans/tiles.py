"""Tiles of the row and elementwise kernels: plain integer arithmetic, no triton import.

The ops' conds build launch plans from these at call time, and a cond may run where no kernel
will (under FakeTensor tracing, say), so they must not import triton.
"""

from __future__ import annotations

from typing import NamedTuple

from python_native.foundations.speckey import SpecializationCache

# Widest row a single program holds in registers without spilling on an H100 (the norm backward
# also keeps the weight and two gradient accumulators live); longer rows decline (norms) or loop
# (softmax).
MAX_ROW_BLOCK = 16384
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
