"""Verify drivers of the aten ops both backends override: softmax, log-softmax, the norms and the
reductions over one dim (``Op.verify`` of each forward, in the Triton and the CuTe DSL families).

One ``Driver`` object per op, imported by both backends' declarations, so the two check the same
calls. Row-wise ops are checked on awkward rows (odd widths, transposed, strided, empty, -inf
entries, large scale); each reduction on rows, on a middle dim with ``keepdim``, on strided and
transposed inputs and on rows of NaN, infinities and ties, whose values and indices must be aten's
exactly. Light: torch only, no DSL, nothing run at import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from python_native_dsls.proving import Driver, Sample, rand

__all__ = ["LAYER_NORM", "LOG_SOFTMAX", "REDUCTIONS", "RMS_NORM", "SOFTMAX", "affine", "finite", "row_cases"]

Cases = Callable[[torch.dtype, str], Iterator[Sample]]
MakeCall = Callable[[torch.Tensor], tuple[Callable[..., Any], list[torch.Tensor]]]


def _rows(dtype: torch.dtype, device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The awkward 2-D inputs every row-wise op is checked on (the reduced dim is the last)."""
    yield "odd width", rand(3, 37, dtype=dtype, device=device)
    yield "transposed", rand(33, 4, dtype=dtype, device=device).t()
    yield "strided rows", rand(4, 64, dtype=dtype, device=device)[:, ::2]
    yield "empty", rand(0, 16, dtype=dtype, device=device)
    inf = rand(3, 20, dtype=dtype, device=device)
    inf[0, :5] = float("-inf")
    inf[1, 7] = float("-inf")
    yield "-inf entries", inf
    yield "1e4 scale", rand(2, 24, dtype=dtype, device=device, scale=1e4)


def row_cases(make_call: MakeCall) -> Cases:
    """``Driver.cases`` of a row-wise op: ``make_call(x)`` gives the call and its inputs per row input."""

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        for name, x in _rows(dtype, device):
            fn, inputs = make_call(x)
            yield Sample(name, fn, inputs)
    return cases


def affine(x: torch.Tensor) -> list[torch.Tensor]:
    """``x`` with a weight and a bias of its last dim's width: a norm's inputs."""
    width = x.shape[-1]
    return [x, rand(width, dtype=x.dtype, device=x.device.type), rand(width, dtype=x.dtype, device=x.device.type)]


def finite(make_call: MakeCall) -> Cases:
    """Row cases without -inf inputs, for ops whose math is undefined there (norms of -inf rows)."""
    inner = row_cases(make_call)

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        return (s for s in inner(dtype, device) if s.source != "-inf entries")
    return cases


SOFTMAX = Driver(row_cases(lambda x: (lambda t: torch.softmax(t, -1), [x])),
                 ("softmax", "nn.functional.softmax"), ("_softmax_backward_data",))
LOG_SOFTMAX = Driver(row_cases(lambda x: (lambda t: torch.log_softmax(t, -1), [x])),
                     ("log_softmax",), ("_log_softmax_backward_data",))
LAYER_NORM = Driver(finite(lambda x: (lambda t, w, b: F.layer_norm(t, t.shape[-1:], w, b), affine(x))),
                    ("nn.functional.layer_norm",), ("native_layer_norm_backward",))
RMS_NORM = Driver(finite(lambda x: (lambda t, w, _b: F.rms_norm(t, t.shape[-1:], w), affine(x))),
                  ("nn.functional.rms_norm",), ("_fused_rms_norm_backward",))


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
    """``(name, input, dim, keepdim)`` of a reduction; ``positive`` inputs near 1 (products stay finite)."""

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


Reduce = Callable[[torch.Tensor, int, bool], Any]  # (input, dim, keepdim) -> the public call's result


def _reduced(call: Reduce, positive: bool = False) -> Cases:
    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        for name, x, dim, keepdim in _inputs(dtype, device, positive):
            yield Sample(name, lambda t, dim=dim, keepdim=keepdim: call(t, dim, keepdim), [x])
    return cases


def _values_and_indices(call: Reduce) -> Cases:
    """Samples of ``torch.max``-like calls: the values (their gradient checked too), then the indices."""

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        for name, x, dim, keepdim in _inputs(dtype, device, False):
            yield Sample(f"{name}: values", lambda t, dim=dim, keepdim=keepdim: call(t, dim, keepdim).values, [x])
            yield Sample(f"{name}: indices", lambda t, dim=dim, keepdim=keepdim: call(t, dim, keepdim).indices, [x])
    return cases


def _sum_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    """``sum`` rows, then half-precision rows summed into fp32 (``dtype=``)."""
    yield from _reduced(lambda t, d, k: t.sum(d, keepdim=k))(dtype, device)
    if dtype != torch.float32:
        yield Sample("dtype=float32", lambda t: t.sum(-1, dtype=torch.float32), [rand(4, 300, dtype=dtype, device=device)])


REDUCTIONS: dict[str, Driver] = {
    "sum.dim_IntList": Driver(_sum_cases, ("sum",), ("sum.dim_IntList",)),
    "mean.dim": Driver(_reduced(lambda t, d, k: t.mean(d, keepdim=k)), ("mean",), ("mean.dim",)),
    "prod.dim_int": Driver(_reduced(lambda t, d, k: t.prod(d, keepdim=k), positive=True), ("prod",), ("prod.dim_int",)),
    "amax": Driver(_reduced(lambda t, d, k: t.amax(d, keepdim=k)), ("amax",), ("amax",)),
    "amin": Driver(_reduced(lambda t, d, k: torch.amin(t, d, keepdim=k)), ("amin",), ("amin",)),
    "argmax": Driver(_reduced(lambda t, d, k: t.argmax(d, keepdim=k)), ("argmax",)),
    "argmin": Driver(_reduced(lambda t, d, k: torch.argmin(t, d, keepdim=k)), ("argmin",)),
    "max.dim": Driver(_values_and_indices(lambda t, d, k: torch.max(t, d, keepdim=k)), ("max.reduction_with_dim",),
                      ("max.dim",)),
    "min.dim": Driver(_values_and_indices(lambda t, d, k: torch.min(t, d, keepdim=k)), ("min.reduction_with_dim",),
                      ("min.dim",)),
}
"""The reductions' drivers by aten op (``max.dim`` / ``min.dim`` samples return the values, with
their gradient, or the indices, each checked against aten)."""
