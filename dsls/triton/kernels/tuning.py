"""Tiles and warps for the norm-backward and long-row softmax kernels, read from one table.

The table is keyed by ``(kernel, dtype, column bucket)``, the bucket being the row width rounded
up to a power of two, and is built once at import from the rules below: nothing is autotuned on
the hot path, and a launch costs one dict lookup.

Rationale, for an H100 SM (64K 32-bit registers, at most 255 per thread, 16-byte vector loads):

- Vector width. A thread should load whole 16-byte vectors: 8 fp16/bf16 or 4 fp32 elements.
  Every tile below gives each thread 16 elements per tensor per step (2 vectors of a 16-bit
  dtype, 4 of fp32): enough loads in flight to cover memory latency, few enough registers.
- Register budget. Elements are converted to fp32 once loaded, so each element a thread holds
  costs a register per live tensor. The norm backward keeps x, dy, xhat, the weight and the
  dw/db accumulators live: ptxas (sm_90a, bf16) gives 118-128 registers at 8 elements per thread
  per tensor (4096 columns, 16 warps) and 230 at 16 (8 warps); a whole 16384-column row at
  32 warps (the 64-register cap of 1024 threads) spills ~500 bytes per thread. So the register
  path uses 8 elements per thread for a whole row (8192 columns: 32 warps, 54-64 registers) and
  4 for short rows packed several to a program (73-82 registers at 8 made a 16-warp program the
  only one its SM could hold; at 4 they take 52-58), and rows over ``NORM_BWD_REGISTER_MAX``
  (8192) columns are streamed in column chunks instead (116 and 96 registers, no spills). Every
  such tile leaves an SM at least 32 resident warps (``python -m python_native inspect`` checks).
- Bytes in flight. Short rows are packed several per program so a step moves at least 8 KB per
  tensor (4096 16-bit or 2048 fp32 elements); warps follow from 16 elements per thread.
- Softmax rows up to ``SOFTMAX_SINGLE_MAX`` columns are held whole by one program of up to 32
  warps (32768 columns = 32 fp32 values per thread, 32K of the SM's 64K registers), so the input
  is read once: 64 registers and no spills for the forward; the backward (y and dy live) spills
  72-140 bytes per thread at 32768 columns, to be weighed against the split path on a GPU. Wider rows (vocabularies) are split across programs of ``SOFTMAX_SLICE`` columns
  each, so that even a few thousand rows fill every SM; a tiny per-row merge of the slices'
  partial max/sum follows.
- Persistent grids (the norm backward's weight-gradient partial sums) use ``PROGRAMS_PER_SM``
  programs per SM: two keep an SM busy while one waits on memory, and the partial-sum buffer
  stays a few MB, resident in L2 for the final column reduction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch

from ..plans.tiles import next_power_of_2

# Widest rows whose backward keeps a whole row (and the dw/db accumulators) in registers.
NORM_BWD_REGISTER_MAX = 8192
# Widest softmax rows held whole by one program; wider rows take the split-row path.
SOFTMAX_SINGLE_MAX = 32768
# Columns per program on the split-row softmax path.
SOFTMAX_SLICE = 16384
# Most slices a split row may have (the merge holds them in one vector); wider rows stream.
SOFTMAX_MAX_SLICES = 1024
# Columns per step of the cross-entropy row kernels (each program streams a vocabulary row in steps
# of this many logits; 16 per thread at 8 warps).
CROSS_ENTROPY_BLOCK = 4096
# Persistent programs per SM for the norm backward.
PROGRAMS_PER_SM = 2
# Persistent programs when not on a GPU (the interpreter): a few, so partial sums are exercised.
INTERPRETER_PROGRAMS = 3

_THREAD_ELEMENTS = 16  # elements per thread per tensor per step (see the vector-width note)
_MAX_WARPS = 32
_BUCKETS = [1 << i for i in range(17)]  # 1 .. 65536 columns
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Tile(NamedTuple):
    block_m: int  # rows per step
    block_n: int  # columns per step
    num_warps: int


def _warps_for(elements: int) -> int:
    return max(2, min(_MAX_WARPS, elements // (32 * _THREAD_ELEMENTS)))


def _min_step(dtype: torch.dtype) -> int:
    """Elements per step that move 8 KB of one tensor."""
    return 8192 // dtype.itemsize


def _rows_tile(dtype: torch.dtype, bucket: int) -> Tile:
    """Whole rows in registers, short rows packed to a full step; 8 elements per thread per
    tensor for a whole row, 4 for packed rows (many live tensors, see the register budget)."""
    block_m = max(1, _min_step(dtype) // bucket)
    per_thread = 8 if block_m == 1 else 4
    return Tile(block_m, bucket, max(2, min(_MAX_WARPS, block_m * bucket // (32 * per_thread))))


def _chunk_tile(dtype: torch.dtype, bucket: int) -> Tile:
    """One row at a time, streamed in chunks of one full step."""
    block_n = min(bucket, _min_step(dtype))
    return Tile(1, block_n, _warps_for(block_n))


def _column_tile(dtype: torch.dtype, bucket: int) -> Tile:
    """A column strip walked down the rows: 8 rows x 256 columns (512 B of a 16-bit row, 1 KB of
    fp32: whole 128-byte lines), 16 elements per thread at 4 warps."""
    return Tile(8, min(bucket, 256), 4)


def _reduce_tile(dtype: torch.dtype, bucket: int) -> Tile:
    """Partial-sum rows (fp32) folded over column strips: strips of bucket/64 columns (64 to 256)
    give 64+ programs at any width, and 2048-element steps keep 16 elements per thread at
    4 warps."""
    block_n = max(64, min(256, bucket // 64, bucket))
    return Tile(2048 // block_n, min(block_n, bucket), 4)


def _softmax_single_tile(dtype: torch.dtype, bucket: int) -> Tile:
    """One whole row per program (wide rows only reach this table)."""
    return Tile(1, bucket, _warps_for(bucket))


_RULES = {
    "norm_bwd_rows": _rows_tile,
    "norm_bwd_row_sums": _chunk_tile,
    "norm_bwd_cols": _column_tile,
    "column_sum": _reduce_tile,
    "softmax_single": _softmax_single_tile,
    "softmax_slice": _chunk_tile,
}

TABLE: dict[tuple[str, torch.dtype, int], Tile] = {
    (kernel, dtype, bucket): rule(dtype, bucket) for kernel, rule in _RULES.items() for dtype in _DTYPES for bucket in _BUCKETS
}


def tile(kernel: str, dtype: torch.dtype, n_cols: int) -> Tile:
    """The table entry for ``kernel`` on rows of ``n_cols`` columns of ``dtype`` (widths past the
    last bucket use the last bucket: those kernels stream columns anyway)."""
    bucket = min(next_power_of_2(n_cols), _BUCKETS[-1])
    return TABLE[(kernel, dtype, bucket)]


# SMs the plans are made for instead of the device's own, while ``planning_for`` is in force.
_planned_sm_count: int | None = None


@contextlib.contextmanager
def planning_for(sm_count: int) -> Iterator[None]:
    """Plan persistent grids for a GPU of ``sm_count`` SMs, whatever the tensors' device: what
    ``python -m python_native inspect`` uses to see, from any machine, the launches a GPU gets."""
    global _planned_sm_count
    previous, _planned_sm_count = _planned_sm_count, sm_count
    try:
        yield
    finally:
        _planned_sm_count = previous


def persistent_programs(device_index: int) -> int:
    """Programs of a persistent grid on CUDA device ``device_index`` (-1: a CPU tensor, the interpreter)."""
    if _planned_sm_count is not None:
        return PROGRAMS_PER_SM * _planned_sm_count
    if device_index < 0:
        return INTERPRETER_PROGRAMS
    from python_native_dsls.constants import sm_count

    return PROGRAMS_PER_SM * sm_count(device_index)
