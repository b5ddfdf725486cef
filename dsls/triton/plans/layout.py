"""What the Triton kernels accept of a layout, and the device they run on (metadata only, FakeTensor safe).

Row views come from ``python_native_dsls.layout``; the checks here add the Triton kernels' own
limits: int32 in-row offsets, rows up to a register tile, dense flat layouts for the elementwise
kernels.
"""

from __future__ import annotations

import functools

import torch

from python_native_dsls.layout import Rows

from ..target import device_type
from .tiles import MAX_ROW_BLOCK

# Offsets within a row (and within a flat elementwise launch) are int32 in the kernels; rows are
# addressed with int64, but a program's row indices are int32 until widened, so row kernels take
# up to MAX_INDEX rows. The headroom keeps the last block's masked lanes from wrapping around.
MAX_INDEX = 2**31 - 2**20
# Longest rows the single-block norm kernels take: one register tile. Longer rows go to aten.
MAX_NORM_COLS = MAX_ROW_BLOCK
MAX_NORM_BWD_COLS = 1 << 24  # the backward streams rows wider than its register tile


@functools.cache
def backend_device() -> str:
    """The device type the kernels run on, fixed once the overrides are installed at their key
    (``all_overrides`` clears this cache so that a re-registration sees the current mode)."""
    return device_type()


def on_backend(*tensors: torch.Tensor | None) -> bool:
    """Every given tensor lives on the device the kernels run on (None entries are skipped)."""
    # ``is_cuda`` / ``is_cpu`` are plain flags; ``t.device`` would build a device object per tensor.
    if backend_device() == "cuda":
        for t in tensors:
            if t is not None and not t.is_cuda:
                return False
        return True
    for t in tensors:
        if t is not None and not t.is_cpu:
            return False
    return True


def row_fits(r: Rows | None) -> bool:
    """A non-empty row view whose in-row offsets and row indices stay within int32 (a program's
    first row, ``program_id * BLOCK_M``, is int32 arithmetic before rows are widened)."""
    return (r is not None and 0 < r.n_rows <= MAX_INDEX and 0 < r.n_cols
            and (r.n_cols - 1) * r.col_stride <= MAX_INDEX)


def dense_like(t: torch.Tensor, *others: torch.Tensor) -> bool:
    """``t`` covers its memory densely without overlap and ``others`` share its shape and strides.

    Such tensors can be processed as flat arrays from their first element, in any dim order
    (contiguous, channels-last, transposed, ...).
    """
    if others:
        # Equal strides and shapes: both contiguous settles it without building stride tuples.
        if t.is_contiguous():
            return all(o.is_contiguous() and o.shape == t.shape for o in others)
        if any(o.shape != t.shape or o.stride() != t.stride() for o in others):
            return False
    elif t.is_contiguous():
        return True
    dims = sorted((step, size) for size, step in zip(t.shape, t.stride(), strict=True) if size != 1)
    expected = 1
    for step, size in dims:
        if step != expected:
            return False
        expected *= size
    return True
