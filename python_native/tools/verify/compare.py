"""How a result is judged against aten's and the float64 truth."""

from __future__ import annotations

import torch

from python_native.foundations.tolerances import ACCUMULATING, POINTWISE, tolerance
from python_native.foundations.tolerances import TOLERANCES as TOLERANCES  # the package's one table, re-exported


def mismatch(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, what: str, grad: bool = False) -> str | None:
    """Why ``got`` fails against aten's ``ref`` and the float64 ``truth``, or None when it passes.

    ``got`` passes where it is within the package's tolerance (``foundations.tolerances``) of
    ``ref``, or no further from ``truth`` than ``ref`` is (plus that tolerance). The second clause
    admits results more accurate than aten's: its CPU kernels accumulate some half-precision
    reductions (layer norm's weight gradient, for one) in half precision. A gradient is judged as an
    accumulating result: in half precision its absolute tolerance grows with the largest gradient.
    """
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"{what}: {tuple(got.shape)}/{got.dtype} vs aten {tuple(ref.shape)}/{ref.dtype}"
    tol = tolerance(got.dtype, ACCUMULATING if grad else POINTWISE)
    rtol, atol = tol.rtol, tol.atol_for(truth)
    g, r, t = got.double(), ref.double(), truth.double()
    close = (g - r).abs() <= atol + rtol * r.abs()
    no_worse = (g - t).abs() <= (r - t).abs() + atol + rtol * t.abs()
    ok = close | no_worse | (g == r) | (g.isnan() & r.isnan())
    if bool(ok.all()):
        return None
    i = int((~ok).flatten().nonzero()[0])
    return (
        f"{what}: {int((~ok).sum())}/{ok.numel()} elements off; first at flat index {i}: "
        f"got {g.flatten()[i].item()}, aten {r.flatten()[i].item()}, float64 {t.flatten()[i].item()}"
    )


def max_error(x: torch.Tensor, truth: torch.Tensor) -> float:
    """Largest absolute difference from the float64 truth over the finite elements of both."""
    d = (x.double() - truth.double()).abs()
    d = d[torch.isfinite(x.double()) & torch.isfinite(truth.double())]
    return float(d.max()) if d.numel() else 0.0


def max_rel_error(x: torch.Tensor, truth: torch.Tensor) -> float:
    """``max_error`` relative to the largest finite magnitude of the float64 truth (0 when that is 0):
    an error of 7.9 means little beside values of 4000, much beside values of 1."""
    t = truth.double()
    t = t[torch.isfinite(t)]
    scale = float(t.abs().max()) if t.numel() else 0.0
    return max_error(x, truth) / scale if scale else 0.0
