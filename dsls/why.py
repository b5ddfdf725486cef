"""Why a backend's kernels decline a call, in words both backends share (metadata only, FakeTensor safe).

Each helper returns the first failing check's reason, or None where its checks pass; a family's
``plan_or_why`` chains them and returns its plan where none has anything to say. What only one
backend's kernels require (index widths, row lengths, devices) is in that backend's own helpers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from python_native_dsls.layout import FLOAT_DTYPES


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def names(dtypes: Iterable[torch.dtype]) -> str:
    """``dtypes`` as a sorted list in words (``"bfloat16, float16, float32"``)."""
    return ", ".join(sorted(name(d) for d in dtypes))


_FLOATS = names(FLOAT_DTYPES)


def dtype(t: torch.Tensor, what: str = "dtype") -> str | None:
    """``t`` is not of a float dtype the kernels take."""
    return None if t.dtype in FLOAT_DTYPES else f"{what} {name(t.dtype)} (the kernels take {_FLOATS})"


def same(t: torch.Tensor, other: torch.Tensor, what: str) -> str | None:
    """``other`` (named ``what``) differs from ``t`` in dtype or shape."""
    if other.dtype != t.dtype:
        return f"{what} dtype {name(other.dtype)} differs from the input's {name(t.dtype)}"
    if other.shape != t.shape:
        return f"{what} shape {tuple(other.shape)} differs from the input's {tuple(t.shape)}"
    return None


def param(p: torch.Tensor | None, what: str, size: Sequence[int], x: torch.Tensor) -> str | None:
    """An affine parameter the kernels cannot read: present, and not contiguous ``size`` in ``x``'s dtype."""
    if p is None:
        return None
    if p.dtype != x.dtype:
        return f"{what} dtype {name(p.dtype)} differs from the input's {name(x.dtype)}"
    if tuple(p.shape) != tuple(size):
        return f"{what} shape {tuple(p.shape)} is not {tuple(size)}"
    return None if p.is_contiguous() else f"{what} is not contiguous"


def normalized(x: torch.Tensor, normalized_shape: Sequence[int]) -> str | None:
    """``x`` does not end with ``normalized_shape``."""
    n = len(normalized_shape)
    if n == 0 or n > x.ndim or tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape):
        return f"normalized_shape {tuple(normalized_shape)} is not the trailing shape of {tuple(x.shape)}"
    return None


def reduced_dim(t: torch.Tensor, dim: int) -> str | None:
    """``dim`` is not a reduction row kernels take: a 0-d input, or a dim with a later dim of size > 1."""
    if t.ndim == 0:
        return "a 0-d input"
    if -t.ndim <= dim < t.ndim and any(size != 1 for size in t.shape[dim % t.ndim + 1:]):
        return f"dim {dim} is not the last dim of size > 1"
    return None
