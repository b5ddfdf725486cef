"""Tensors seen as rows: the layout analysis both backends' conds share (metadata only, FakeTensor safe).

Row kernels see a tensor as ``n_rows x n_cols`` with one stride per axis. Any tensor whose
leading dims and whose reduced dims each collapse to one evenly strided axis fits, which covers
contiguous tensors, row slices of wider buffers and the all-zero strides of expanded gradients
without a copy. What each backend's kernels then accept of such a view (index widths, unit column
strides, row lengths) is the backend's own check.

The analysis runs once per layout: in a family's ``plan_or_why``, whose result (the plan the impl
receives, holding the row view) its cond caches per layout key (``python_native_dsls.family``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})


class Rows(NamedTuple):
    """A tensor viewed as a strided matrix."""

    n_rows: int
    n_cols: int
    row_stride: int
    col_stride: int


def collapse(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """``(numel, stride)`` when the dims form a single evenly strided axis, else None."""
    numel, stride, expected = 1, None, 0
    for size, step in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride is None:
            stride = step
        elif step != expected:
            return None
        expected = step * size
        numel *= size
    return numel, 1 if stride is None else stride


def as_rows(t: torch.Tensor, n_inner: int) -> Rows | None:
    """View ``t`` as rows of its last ``n_inner`` dims, or None when no single stride pair fits."""
    if n_inner < 1 or n_inner > t.ndim:
        return None
    axis = t.ndim - n_inner
    if t.is_contiguous():
        n_cols = math.prod(t.shape[axis:])
        return Rows(t.numel() // n_cols, n_cols, n_cols, 1) if n_cols else Rows(math.prod(t.shape[:axis]), 0, 0, 1)
    sizes, strides = tuple(t.shape), t.stride()
    inner = collapse(sizes[axis:], strides[axis:])
    outer = collapse(sizes[:axis], strides[:axis])
    if inner is None or outer is None:
        return None
    return Rows(outer[0], inner[0], outer[1], inner[1])


def reduced_rows(t: torch.Tensor, dim: int) -> Rows | None:
    """Rows for a reduction over ``dim`` alone: every later dim must have size 1."""
    if t.ndim == 0 or not -t.ndim <= dim < t.ndim:
        return None
    dim %= t.ndim
    if any(size != 1 for size in t.shape[dim + 1 :]):
        return None
    return as_rows(t, t.ndim - dim)


def normalized_axis(t: torch.Tensor, normalized_shape: Sequence[int]) -> int | None:
    """First normalized dim when ``t`` ends with ``normalized_shape``, else None."""
    n = len(normalized_shape)
    if n == 0 or n > t.ndim or tuple(t.shape[t.ndim - n :]) != tuple(normalized_shape):
        return None
    return t.ndim - n


def stat_shape(t: torch.Tensor, axis: int) -> list[int]:
    """Shape of per-row statistics as aten returns them: leading dims kept, the rest size 1."""
    return [*t.shape[:axis], *([1] * (t.ndim - axis))]
