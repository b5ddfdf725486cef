"""How close an override's result must be to aten's: one table, per class of op and dtype, for
checked mode (``features/checked/compare.py``), ``verify`` (``tools/verify/compare.py``) and the
kernel tests, so that "matches aten" means the same everywhere.

Where each number comes from:

- ``rtol`` and ``atol`` are ``torch.testing.assert_close``'s defaults for the dtype: about ten
  float32 ulps (``1.3e-6``), one float16 ulp (``1e-3``), two bfloat16 ulps (``1.6e-2``), and
  ``atol = 1e-5`` below float64. A pointwise result (each element from its own inputs, rounded
  once, as aten rounds it) stays within them.
- An accumulating result (a gradient, a reduction, or anything aten computes in several rounded
  steps) in float16 or bfloat16 also gets ``rtol`` times the reference's largest finite magnitude
  added to ``atol``: cancellation leaves small elements with errors of the terms' size, not of their
  own. aten's CPU kernels accumulate some half-precision sums (layer norm's weight gradient, for
  one) in half precision, and its composites (the reference of ``python_native::gelu_tanh``,
  ``rotary``, ...) round each step, while a kernel computes in float32 and rounds once. float32 and
  wider need no allowance.
- Checked mode had a table of its own: float16 ``atol = 1e-3``, bfloat16 ``1e-2``, float32
  ``rtol = 1e-5``. The stricter float32 number is kept: every float32 sample of ``verify`` passes
  checked mode at it. The fixed half-precision ``atol`` gave way to the accumulating rule above, as
  checked mode judges every result (it knows the override, not whether the op sums): at the
  pointwise numbers, half-precision samples of layer norm's and RMS norm's backwards, ``rotary``,
  ``gelu_tanh``, ``quick_gelu`` and ``index_add`` raised false mismatches, which the rule removes
  (``tests/triton/test_checked_half.py`` runs them). ``prod`` is left out of that claim: the
  relative error of a product grows with its number of factors, and one tiny half-precision
  product of ``verify``'s differs from aten's by more under either table.
- A statistic a half-precision call keeps in float32 (layer norm's and group norm's mean and rstd,
  RMS norm's rstd, which aten's CUDA kernels return in float32 beside a float16 or bfloat16 output)
  is a float32 sum of half-precision terms: summed in another order, it differs by float32 roundings
  of the terms' size, not of its own. A mean of 24.7 over 24 terms of size 1e4 differed from aten's
  on an H200 by 8.2e-5 (3.3e-6 relative), past the float32 numbers. Such an output, wider than the
  narrowest floating output of its call, is judged at that narrower dtype (``judged_dtypes``): the
  precision the call's terms and its main output have.
- A dtype not in the table (integers, bool) must match exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

POINTWISE = "pointwise"  # each element from its own inputs, rounded once
ACCUMULATING = "accumulating"  # each element a sum of many rounded terms (gradients, reductions)
OP_CLASSES = (POINTWISE, ACCUMULATING)


@dataclass(frozen=True)
class Tolerance:
    """``|got - ref| <= atol + rtol * |ref|``, with ``of_largest`` times the reference's largest finite
    magnitude added to ``atol`` (see ``atol_for``)."""

    rtol: float
    atol: float
    of_largest: float = 0.0

    def atol_for(self, reference: torch.Tensor) -> float:
        """``atol``, widened by ``of_largest`` times the largest finite magnitude of ``reference``."""
        if not self.of_largest or not reference.numel():
            return self.atol
        largest = reference.detach().abs().double().nan_to_num(0.0, 0.0, 0.0).max().item()
        return self.atol + self.of_largest * largest


# (rtol, atol) of a pointwise result per dtype: torch.testing.assert_close's defaults.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
HALF = (torch.float16, torch.bfloat16)  # the dtypes whose accumulating results widen with the largest element

TABLE: dict[tuple[str, torch.dtype], Tolerance] = {
    **{(POINTWISE, dtype): Tolerance(rtol, atol) for dtype, (rtol, atol) in TOLERANCES.items()},
    **{(ACCUMULATING, dtype): Tolerance(rtol, atol, rtol if dtype in HALF else 0.0)
       for dtype, (rtol, atol) in TOLERANCES.items()},
}
EXACT = Tolerance(0.0, 0.0)


def tolerance(dtype: torch.dtype, op_class: str = POINTWISE) -> Tolerance:
    """The tolerance of a result of ``dtype`` from an op of ``op_class``; exact for dtypes not in the table."""
    if op_class not in OP_CLASSES:
        raise ValueError(f"no class of op is named {op_class!r}; the classes are {list(OP_CLASSES)}")
    return TABLE.get((op_class, dtype), EXACT)


def judged_dtypes(dtypes: Sequence[torch.dtype | None]) -> list[torch.dtype | None]:
    """Per output of one call (None for a non-tensor), the dtype whose tolerance judges it: its own,
    except that a floating output wider than the call's narrowest floating output (a float32
    statistic of a half-precision call) is judged at that narrowest dtype (see the module docstring)."""
    floating = [d for d in dtypes if d is not None and d.is_floating_point]
    narrowest = min(floating, key=lambda d: torch.finfo(d).bits, default=None)
    if narrowest is None or narrowest not in HALF:
        return list(dtypes)
    narrow_bits = torch.finfo(narrowest).bits
    return [narrowest if d in floating and torch.finfo(d).bits > narrow_bits else d for d in dtypes]
