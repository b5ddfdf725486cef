"""Launch parameters shared by the kernels, computed once per shape class and cached."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dsls.triton import interpret_mode
from dsls.triton.ops._layout import MAX_NORM_COLS
from python_native.speckey import SpecializationCache

# Widest row a single program holds in registers; longer rows decline (norms) or loop (softmax).
MAX_ROW_BLOCK = MAX_NORM_COLS
# Elements per program for short rows: enough rows are packed together to fill the tile.
ROW_TILE = 2048
# Elements per program for elementwise kernels: 16 per thread at 8 warps.
ELEMENTWISE_BLOCK = 4096
ELEMENTWISE_WARPS = 8


# Triton's interpreter truncates fp32 -> bf16 where GPUs round to nearest even; under the
# interpreter the kernels round explicitly so that results match what a GPU produces.
_ROUND_BF16 = tl.constexpr(interpret_mode())


@triton.jit
def cast_out(x, dtype: tl.constexpr):
    """``x.to(dtype)`` with round-to-nearest-even, also under the interpreter."""
    if _ROUND_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


class RowConfig(NamedTuple):
    block_m: int  # rows per program
    block_n: int  # columns per program: the whole row, rounded up to a power of two
    num_warps: int


def _build_row_config(n_cols: int, rows_hint: int) -> RowConfig:
    block_n = triton.next_power_of_2(n_cols)
    block_m = min(max(1, ROW_TILE // block_n), rows_hint)
    num_warps = min(16, max(2, block_m * block_n // 512))
    return RowConfig(block_m, block_n, num_warps)


_ROW_CONFIGS: SpecializationCache[RowConfig] = SpecializationCache(_build_row_config)


def row_config(n_rows: int, n_cols: int) -> RowConfig:
    """Tile for a row-wise kernel; ``n_rows`` only caps how many rows share a program."""
    rows_hint = min(triton.next_power_of_2(n_rows), ROW_TILE)
    return _ROW_CONFIGS.get((n_cols, rows_hint), n_cols, rows_hint)


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def program_slots(device: torch.device) -> int:
    """How many persistent programs fill the device (a few per SM; a handful in the interpreter)."""
    if device.type != "cuda":
        return 4
    return 4 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@contextlib.contextmanager
def on_device(t: torch.Tensor) -> Iterator[None]:
    """Make ``t``'s GPU current while launching: Triton launches on the current device."""
    if t.device.type == "cuda" and t.device.index is not None and t.device.index != torch.cuda.current_device():
        with torch.cuda.device(t.device.index):
            yield
    else:
        yield
