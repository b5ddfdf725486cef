"""Scalar arguments as aten converts them to an op's dtype, and the values the kernels must leave to aten.

aten converts a ``Scalar`` argument (``index_add``'s ``alpha``, ``add``'s ``alpha``, ``fill``'s
``value``...) to the dtype it computes in with a checked conversion (``c10::checked_convert``):
a finite value beyond the dtype's range raises ``RuntimeError: value cannot be converted to type
at::Half without overflow``; infinities and NaN pass where the dtype has them; integer types take
negative values down to minus their range (two's complement wrap) and no NaN or infinity. A kernel
that scales by such a value in float32 would return a result where aten raises, so the families
decline those calls (``overflow_why``) and aten raises its own error.

A ``float`` argument (an ``eps``) that aten's CPU kernels add in double is rounded by the
kernels to float32: a finite, non-zero value outside float32's normal range becomes infinity, a
subnormal or zero there, and the result drifts from aten's (``float32_why``).

Backend-neutral and light: only the dtype ranges, no DSL import.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# What c10::overflows compares against: the dtype's lowest and largest finite values.
_FLOAT32_TINY = 2.0**-126  # the smallest normal float32


def _limits(dtype: torch.dtype) -> tuple[float, float] | None:
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return float(info.min), float(info.max)
    if dtype == torch.bool or dtype.is_complex:
        return None
    info = torch.iinfo(dtype)
    return int(info.min), int(info.max)


def converts(value: Any, dtype: torch.dtype) -> bool:
    """Whether aten converts the Scalar ``value`` to ``dtype`` without raising (``c10::overflows``)."""
    if isinstance(value, bool) or dtype == torch.bool:
        return True
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return False  # no Scalar holds it: torch raises before any conversion
    if isinstance(value, complex):
        if not dtype.is_complex and value.imag != 0:
            return False
        value = value.real
    limits = _limits(dtype)
    if limits is None or not isinstance(value, (int, float)):
        return True  # complex dtypes, or a value aten itself will judge
    low, high = limits
    if isinstance(value, float):
        if math.isnan(value):
            return dtype.is_floating_point
        if math.isinf(value):
            return dtype.is_floating_point
    if not dtype.is_floating_point and not dtype.is_signed and value < 0 and isinstance(value, int):
        return -value <= high  # unsigned types wrap negative integers, down to minus their range
    return low <= value <= high


def overflow_why(name: str, value: Any, dtype: torch.dtype) -> str | None:
    """Why a call whose Scalar ``name`` aten cannot convert to ``dtype`` is left to aten (which
    raises its own error), else None."""
    if converts(value, dtype):
        return None
    return f"{name} = {value!r} cannot be converted to {str(dtype).removeprefix('torch.')} without overflow (aten raises)"


def converted_why(name: str, value: Any, like: Any) -> str | None:
    """``overflow_why`` for the dtype of tensor ``like`` (None where ``like`` is no tensor)."""
    return overflow_why(name, value, like.dtype) if isinstance(like, torch.Tensor) else None


def float32_why(name: str, value: Any) -> str | None:
    """Why a ``float`` argument the kernels round to float32 is left to aten: a finite, non-zero
    value float32 holds only as infinity, a subnormal or zero; else None."""
    if value is None or value.__class__ not in (int, float) or value == 0 or not math.isfinite(value):
        return None
    if abs(value) < _FLOAT32_TINY:
        return f"{name} = {value!r} is below float32's normal range (the kernels compute in float32)"
    if abs(value) > torch.finfo(torch.float32).max:
        return f"{name} = {value!r} overflows float32 (the kernels compute in float32)"
    return None
