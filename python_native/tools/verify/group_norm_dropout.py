"""Drivers of group norm and dropout, and the structural check dropout's random results are judged by.

Dropout's output depends on the random stream, which the overrides draw differently from aten, so
its samples are not compared value by value: every element must be either kept (output ``x *
scale``, gradient ``grad * scale``) or dropped (both zero; a dropped NaN or infinity gives NaN),
with one scale, aten's where aten kept anything and ``1 / (1 - p)`` where ``p`` is known, and on
large tensors a kept fraction within six standard deviations of ``1 - p``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from python_native.tools.verify.compare import TOLERANCES
from python_native.tools.verify.samples import Driver, Sample, rand

_GROUP_NORM_CASES: list[tuple[str, tuple[int, ...], int, torch.memory_format, str]] = [
    # name, shape, groups, layout, parameters ("wb": weight and bias, "w": weight only, "": none)
    ("NCHW, odd spatial size", (2, 6, 5, 7), 3, torch.contiguous_format, "wb"),
    ("channels_last", (2, 8, 6, 6), 4, torch.channels_last, "wb"),
    ("a group per channel, weight only", (3, 4, 9), 4, torch.contiguous_format, "w"),
    ("channels_last_3d, no affine", (2, 4, 3, 3, 3), 2, torch.channels_last_3d, ""),
    ("N x C only", (5, 6), 2, torch.contiguous_format, "wb"),
    ("one group, long rows", (2, 3, 40, 40), 1, torch.contiguous_format, "wb"),
]


def _group_norm_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    for name, shape, groups, layout, params in _GROUP_NORM_CASES:
        x = rand(*shape, dtype=dtype, device=device).contiguous(memory_format=layout)
        c = shape[1]
        inputs = [x] + [rand(c, dtype=dtype, device=device) for _ in params]

        def fn(t, *p, _g=groups, _params=params):
            weight = p[0] if "w" in _params else None
            bias = p[1] if "b" in _params else None
            return F.group_norm(t, _g, weight, bias, eps=1e-5)

        yield Sample(name, fn, inputs)
    offset = (rand(2, 4, 8, 8, dtype=torch.float32, device=device) * 1e2 + 1e4).to(dtype)
    yield Sample("1e4 mean, 1e2 spread", lambda t: F.group_norm(t, 2), [offset])


def _dropout_inputs(dtype: torch.dtype, device: str) -> list[tuple[str, torch.Tensor, float]]:
    special = rand(8, 16, dtype=dtype, device=device)
    special[0, :4] = float("nan")
    special[1, :4] = float("inf")
    return [
        ("2-D", rand(16, 100, dtype=dtype, device=device), 0.3),
        ("channels_last", rand(2, 8, 5, 5, dtype=dtype, device=device).contiguous(memory_format=torch.channels_last),
         0.5),
        ("transposed", rand(30, 20, dtype=dtype, device=device).t(), 0.2),
        ("NaN and inf entries", special, 0.5),
        ("large: kept fraction", rand(128, 256, dtype=dtype, device=device), 0.25),
    ]


def _dropout_cases(native_first: bool) -> Callable[[torch.dtype, str], Iterator[Sample]]:
    """``F.dropout`` (and ``F.dropout2d``) cases, and direct ``torch.native_dropout`` calls, which
    reach ``native_dropout`` on every device (``F.dropout`` does only on GPUs)."""

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        native, public = [], []
        for name, x, p in _dropout_inputs(dtype, device):
            native.append(Sample(f"native_dropout {name}", lambda t, _p=p: torch.native_dropout(t, _p, True)[0],
                                 [x], {"p": p}))
            public.append(Sample(f"F.dropout {name}", lambda t, _p=p: F.dropout(t, _p, True), [x], {"p": p}))
        x = rand(4, 6, 3, 3, dtype=dtype, device=device)
        public.append(Sample("F.dropout2d", lambda t: F.dropout2d(t, 0.5, True), [x], {"p": 0.5}))
        x = rand(6, 7, dtype=dtype, device=device)
        native += [Sample("native_dropout p=0", lambda t: torch.native_dropout(t, 0.0, True)[0], [x], {"p": 0.0}),
                   Sample("native_dropout train=None", lambda t: torch.native_dropout(t, 0.4, None)[0], [x],
                          {"p": 0.4})]
        first, second = (native, public) if native_first else (public, native)
        for pair in zip(first, second, strict=False):
            yield from pair
        longer = first if len(first) > len(second) else second
        yield from longer[min(len(first), len(second)):]

    return cases


def _ratio(num: torch.Tensor, den: torch.Tensor, where: torch.Tensor) -> float | None:
    """The median of ``num / den`` over ``where`` (finite, non-zero ``den``), or None where there is none."""
    where = where & torch.isfinite(den) & (den != 0) & torch.isfinite(num)
    return float((num[where] / den[where]).median()) if bool(where.any()) else None


def _judge(x: torch.Tensor, run: Any, dtype: torch.dtype) -> tuple[float | None, float | None, torch.Tensor, list[str]]:
    """``(output scale, gradient scale, kept, problems)`` of one run: the mask read off the input
    gradient (the output cannot tell a dropped zero from a kept one), each scale off the kept
    elements. The two scales differ where aten's derivative says so (``train=None``: 1)."""
    y = run.out.double()
    grad = None if run.grads[0] is None or run.grad_out is None else run.grads[0].double()
    kept = (grad != 0) if grad is not None else (y != 0)
    rtol, atol = TOLERANCES.get(dtype, (1e-7, 1e-7))
    problems: list[str] = []
    scale = _ratio(y, x, kept)
    if scale is not None:
        near = torch.isclose(y, x * scale, rtol=rtol, atol=atol, equal_nan=True)
        if not bool(near[kept].all()):
            problems.append(f"{int((~near[kept]).sum())} kept elements are not x * {scale:.6g}")
    grad_scale = None
    if grad is not None:
        g = run.grad_out.double()
        grad_scale = _ratio(grad, g, kept)
        if grad_scale is not None:
            near = torch.isclose(grad, g * grad_scale, rtol=rtol, atol=atol)
            if not bool(near[kept].all()):
                problems.append(f"{int((~near[kept]).sum())} kept gradients are not grad * {grad_scale:.6g}")
    dropped_ok = (y == 0) | (~torch.isfinite(x) & y.isnan())
    if not bool(dropped_ok[~kept].all()):
        problems.append(f"{int((~dropped_ok[~kept]).sum())} dropped elements are not zero")
    return scale, grad_scale, kept, problems


def _off(what: str, got: float | None, expected: float | None, rtol: float) -> list[str]:
    if got is None or expected is None or abs(got - expected) <= 2 * rtol * abs(expected):
        return []
    return [f"{what} {got:.6g}, expected {expected:.6g}"]


def dropout_structure(sample: Sample, got: Any, ref: Any) -> list[str]:
    """What is wrong with a dropout run (``got``) next to aten's (``ref``); empty when nothing is."""
    if got.out.shape != ref.out.shape or got.out.dtype != ref.out.dtype:
        return [f"output: {tuple(got.out.shape)}/{got.out.dtype} vs aten {tuple(ref.out.shape)}/{ref.out.dtype}"]
    x = sample.inputs[0].detach().double()
    dtype = got.out.dtype
    scale, grad_scale, kept, problems = _judge(x, got, dtype)
    ref_scale, ref_grad_scale, _, _ = _judge(x, ref, dtype)
    rtol = TOLERANCES.get(dtype, (1e-7, 0.0))[0]
    p, training = sample.meta.get("p", 0.5), sample.meta.get("training", True)
    expected = ref_scale
    if "p" in sample.meta or "training" in sample.meta:
        expected = 1.0 if not training or p == 0 else (None if p == 1 else 1.0 / (1.0 - p))
    problems += _off("scale", scale, expected, rtol)
    problems += _off("gradient scale", grad_scale, ref_grad_scale if ref_grad_scale is not None else expected, rtol)
    if training and p == 1 and bool(kept.any()):
        problems.append("p=1 kept elements")
    n = kept.numel()
    if "p" in sample.meta and n >= 4096 and training:
        spread = 6 * math.sqrt(p * (1 - p) / n) + 1 / n
        fraction = float(kept.double().mean())
        if abs(fraction - (1 - p)) > spread:
            problems.append(f"kept fraction {fraction:.4f}, expected {1 - p:.4f} +- {spread:.4f}")
    return problems


DRIVERS: dict[str, Driver] = {
    "native_group_norm": Driver(_group_norm_cases, ("nn.functional.group_norm",), ("native_group_norm_backward",)),
    "native_dropout": Driver(_dropout_cases(native_first=True), ("nn.functional.dropout",),
                             ("native_dropout_backward",), dropout_structure),
    "bernoulli_.float": Driver(_dropout_cases(native_first=False),
                               ("nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d"),
                               (), dropout_structure),
}
