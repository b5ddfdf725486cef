"""Drivers of the reductions over one dim: sum, mean, prod, amax, amin, argmax, argmin, max.dim, min.dim.

Each op is checked on rows (the last dim), on a middle dim (strided reductions) with ``keepdim``,
on strided and transposed inputs, and on rows of NaN, infinities and ties, whose values and
indices must be aten's exactly. ``max.dim`` / ``min.dim`` samples return the values (with their
gradient) or the indices, each checked against aten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from python_native.tools.verify.samples import Driver, Sample, rand

Call = Callable[[torch.Tensor, int, bool], torch.Tensor]


def _special(dtype: torch.dtype, device: str) -> torch.Tensor:
    """NaN among numbers, all NaN, all -inf, infinities, ties, signed zeros: one row each."""
    nan, inf = float("nan"), float("inf")
    return torch.tensor([
        [1.0, nan, 3.0, nan, 2.0, 0.5, -1.0, 4.0],
        [nan] * 8,
        [-inf] * 8,
        [inf, 2.0, inf, 1.0, -inf, -inf, 0.0, 1.0],
        [2.0, 5.0, 5.0, 1.0, 1.0, 5.0, -3.0, 0.0],
        [-0.0, 0.0, -0.0, 0.0, 0.0, -0.0, 1.5, 1.5],
    ], dtype=torch.float32, device=device).to(dtype)


def _inputs(dtype: torch.dtype, device: str, positive: bool) -> Iterator[tuple[str, torch.Tensor, int, bool]]:
    """``(name, input, dim, keepdim)``; ``positive`` inputs near 1 (products stay finite)."""

    def make(*shape: int) -> torch.Tensor:
        if positive:
            return (torch.rand(*shape, device=device) * 0.2 + 0.9).to(dtype)
        return rand(*shape, dtype=dtype, device=device, scale=2.0)

    yield "rows", make(3, 37), -1, False
    yield "middle dim, keepdim", make(2, 33, 5), 1, True
    yield "strided rows", make(4, 64)[:, ::2], 1, False
    yield "transposed", make(33, 4).t(), 1, False
    yield "leading dim", make(40, 3), 0, True
    yield "long row", make(2, 3000), -1, False
    if positive:
        with_zero = make(3, 20)
        with_zero[1, 4] = 0.0
        yield "a zero", with_zero, 1, False
    else:
        yield "NaN, infinities and ties", _special(dtype, device), 1, False
        yield "NaN, infinities and ties down columns", _special(dtype, device), 0, False


def _cases(call: Call, positive: bool = False) -> Callable[[torch.dtype, str], Iterator[Sample]]:
    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        for name, x, dim, keepdim in _inputs(dtype, device, positive):
            yield Sample(name, lambda t, dim=dim, keepdim=keepdim: call(t, dim, keepdim), [x])
    return cases


def _values_and_indices(fn: Callable[..., Any]) -> Callable[[torch.dtype, str], Iterator[Sample]]:
    """Samples of ``torch.max``-like calls: the values (their gradient checked too), then the indices."""

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        for name, x, dim, keepdim in _inputs(dtype, device, False):
            yield Sample(f"{name}: values", lambda t, dim=dim, keepdim=keepdim: fn(t, dim, keepdim).values, [x])
            yield Sample(f"{name}: indices", lambda t, dim=dim, keepdim=keepdim: fn(t, dim, keepdim).indices, [x])
    return cases


def _dtype_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    """``sum`` rows, then half-precision rows summed into fp32 (``dtype=``)."""
    yield from _cases(lambda t, d, k: t.sum(d, keepdim=k))(dtype, device)
    if dtype != torch.float32:
        yield Sample("dtype=float32", lambda t: t.sum(-1, dtype=torch.float32), [rand(4, 300, dtype=dtype, device=device)])


DRIVERS: dict[str, Driver] = {
    "sum.dim_IntList": Driver(_dtype_cases, ("sum",), ("sum.dim_IntList",)),
    "mean.dim": Driver(_cases(lambda t, d, k: t.mean(d, keepdim=k)), ("mean",), ("mean.dim",)),
    "prod.dim_int": Driver(_cases(lambda t, d, k: t.prod(d, keepdim=k), positive=True), ("prod",), ("prod.dim_int",)),
    "amax": Driver(_cases(lambda t, d, k: t.amax(d, keepdim=k)), ("amax",), ("amax",)),
    "amin": Driver(_cases(lambda t, d, k: torch.amin(t, d, keepdim=k)), ("amin",), ("amin",)),
    "argmax": Driver(_cases(lambda t, d, k: t.argmax(d, keepdim=k)), ("argmax",)),
    "argmin": Driver(_cases(lambda t, d, k: torch.argmin(t, d, keepdim=k)), ("argmin",)),
    "max.dim": Driver(_values_and_indices(lambda t, d, k: torch.max(t, d, keepdim=k)), ("max.reduction_with_dim",),
                      ("max.dim",)),
    "min.dim": Driver(_values_and_indices(lambda t, d, k: torch.min(t, d, keepdim=k)), ("min.reduction_with_dim",),
                      ("min.dim",)),
}
