"""How checked mode compares a result with aten's: the kind of result (dtype, shape, device,
contiguity where aten's is contiguous), then the values within the package's tolerance for the dtype
(``foundations/tolerances.py``, the table ``verify`` and the kernel tests use too).

The contracts (``contracts.py``, ``draws.py``) reuse the two halves separately: they always check
the kind of each output, and compare values only where aten fixes them.
"""

from __future__ import annotations

from typing import Any

import torch

from python_native.foundations.tolerances import ACCUMULATING, judged_dtypes, tolerance
from python_native.foundations.tolerances import TOLERANCES as TOLERANCES  # the package's one table, re-exported

# Checked mode knows the override, not whether its op sums: every result is judged as an accumulating
# one (see ``foundations.tolerances``), with no float64 truth to tell which of two results is closer.
OP_CLASS = ACCUMULATING


class OverrideMismatch(AssertionError):
    """An override's result differs from aten's kernel on the same inputs (checked mode), or breaks
    the contract aten keeps where it fixes no bits (ties, random draws)."""


def outputs(actual: Any, expected: Any, where: str) -> list[tuple[Any, Any, str]]:
    """``(actual, expected, where)`` per output, after checking that the result has aten's arity."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            raise OverrideMismatch(f"{where} returned {describe(actual)}; aten returns {describe(expected)}")
        return [(a, e, f"{where}, output {i}") for i, (a, e) in enumerate(zip(actual, expected, strict=True))]
    return [(actual, expected, where)]


def pairs(actual: Any, expected: Any, where: str) -> list[tuple[Any, Any, str]]:
    """``outputs``, each checked to be aten's kind of result (the values are left to the caller)."""
    found = outputs(actual, expected, where)
    for a, e, at in found:
        check_kind(a, e, at)
    return found


def compare(actual: Any, expected: Any, where: str) -> None:
    """Raise ``OverrideMismatch`` unless ``actual`` matches aten's ``expected`` result. A float32
    statistic beside a half-precision output is judged at the half dtype (``tolerances.judged_dtypes``)."""
    found = outputs(actual, expected, where)
    judged = judged_dtypes([e.dtype if isinstance(e, torch.Tensor) else None for _, e, _ in found])
    for (a, e, at), dtype in zip(found, judged, strict=True):
        if check_kind(a, e, at):
            values_close(a, e, at, judged_as=dtype)


def check_kind(actual: Any, expected: Any, where: str) -> bool:
    """Check that ``actual`` is the kind of result aten's ``expected`` is; True when both are tensors
    (whose values are then still to compare), False for a non-tensor output, already compared."""
    if not isinstance(expected, torch.Tensor):
        if actual != expected:
            raise OverrideMismatch(f"{where} returned {actual!r}; aten returns {expected!r}")
        return False
    if not isinstance(actual, torch.Tensor):
        raise OverrideMismatch(f"{where} returned {describe(actual)}; aten returns {describe(expected)}")
    if actual.dtype != expected.dtype:
        raise OverrideMismatch(f"{where} returned dtype {actual.dtype}; aten returns {expected.dtype}")
    if actual.shape != expected.shape:
        raise OverrideMismatch(f"{where} returned shape {tuple(actual.shape)}; aten returns {tuple(expected.shape)}")
    if actual.device != expected.device:
        raise OverrideMismatch(f"{where} returned a tensor on {actual.device}; aten returns one on {expected.device}")
    if expected.is_contiguous() and not actual.is_contiguous():
        raise OverrideMismatch(
            f"{where} returned strides {actual.stride()}; aten returns a contiguous tensor {expected.stride()}"
        )
    return True


def values_close(actual: torch.Tensor, expected: torch.Tensor, where: str, what: str = "",
                 op_class: str = OP_CLASS, judged_as: torch.dtype | None = None) -> None:
    """Values within the package's tolerance for ``judged_as`` (by default the result's dtype) and
    ``op_class`` (``foundations.tolerances``), NaN equal to NaN; ``what`` names the contract checked."""
    tol = tolerance(judged_as or expected.dtype, op_class)
    rtol, atol = tol.rtol, tol.atol_for(expected)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
    except AssertionError as e:
        raise OverrideMismatch(f"{where} differs from aten{what} (rtol={rtol}, atol={atol}): {e}") from None


def same_values(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal, or NaN in both (bool tensor, ``a`` and ``b`` broadcast)."""
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= a.isnan() & b.isnan()
    return same


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(describe(v) for v in value)})"
    return "None" if value is None else f"{type(value).__name__} {value!r}"


def first_difference(same: torch.Tensor) -> str:
    """``"k of n elements, first at index (i, j)"`` for a bool tensor with at least one False."""
    bad = (~same).nonzero()
    return f"{bad.shape[0]} of {same.numel()} elements, first at index {tuple(bad[0].tolist())}"
