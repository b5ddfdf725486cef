"""Why the CuTe DSL kernels decline a call: the checks of their limits, each answering in words.

The families' ``plan_or_why`` functions chain these (and the shared ones of
``python_native_dsls.why``, re-exported here) and return their plan where none has anything
to say. Each helper returns the first failing check's reason, or None where its checks pass.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from python_native_dsls.layout import Rows, as_rows
from python_native_dsls.why import dtype, name, names, normalized, param, reduced_dim, same

from ..target import MINIMUM_CAPABILITY
from ._rows import MAX_COLS, MAX_ROWS

__all__ = ["device", "dtype", "name", "names", "norm_rows", "normalized", "param", "reduced_dim", "rows", "same", "stats"]

_NEEDED = ".".join(map(str, MINIMUM_CAPABILITY))


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device(*tensors: torch.Tensor | None) -> str | None:
    """Some tensor is not on a CUDA device the kernels support (compute capability 8.0+)."""
    for t in tensors:
        if t is None:
            continue
        if t.device.type != "cuda":
            return f"device {t.device.type}: the kernels run on CUDA devices"
        found = _capability(t.device.index)
        if found < MINIMUM_CAPABILITY:
            return f"CUDA device of compute capability {found[0]}.{found[1]} (the kernels need {_NEEDED} or newer)"
    return None


def rows(r: Rows | None, what: str = "rows") -> str | None:
    """A row view the kernels cannot read: none, empty, columns not unit-strided, beyond their limits."""
    if r is None:
        return f"layout: the {what} do not form one strided row axis"
    if r.n_rows == 0 or r.n_cols == 0:
        return "empty input"
    if r.col_stride != 1 and r.n_cols != 1:
        return f"layout: the {what}' columns are {r.col_stride} apart (the kernels read unit-stride rows)"
    if r.row_stride < 0:
        return f"layout: the {what} run backwards in memory"
    if r.n_rows > MAX_ROWS or r.n_cols > MAX_COLS:
        return f"{r.n_rows} {what} of {r.n_cols} exceed the kernels' grid or int32 columns"
    return None


def stats(stat: torch.Tensor, what: str, x: torch.Tensor, n_rows: int) -> str | None:
    """Saved per-row statistics the kernels cannot read as a dense fp32 vector."""
    if stat.numel() != n_rows:
        return f"{what} has {stat.numel()} values for {n_rows} rows"
    if stat.dtype != torch.float32:
        return f"{what} dtype {name(stat.dtype)} (the kernels read float32 statistics)"
    return None if stat.is_contiguous() else f"{what} is not contiguous"


def norm_rows(x: torch.Tensor, normalized_shape: Sequence[int], backward: bool) -> Rows | str:
    """``x``'s rows where the norm kernels take them (any length, forward and backward), else why not."""
    found = dtype(x) or normalized(x, normalized_shape)
    if found:
        return found
    r = as_rows(x, len(normalized_shape))
    return rows(r) or r
