"""``python_native::rms_norm`` and its backward on the Triton norm row kernels.

The op is declared by ``python_native.ops``: the RMS norm transformers' modules write by hand, in
their casting modes. Llama's (``weight_in_fp32`` off) normalizes in fp32, casts back to the
input's dtype, then multiplies by ``weight`` (or ``offset + weight`` in the weight's dtype): the
result's dtype promotes. Gemma's (``weight_in_fp32``) multiplies by ``offset + weight.float()`` in
fp32 and casts the product back. The kernels are those of ``_fused_rms_norm`` with the weight
offset and the casting rule as parameters (``kernels.norm``); the forward keeps no statistics,
and the backward (gradients computed in fp32) recomputes each row's rstd from the input. Rows are
independent, so leading dims that collapse to one row stride only in another order (q and k
transposed to ``(batch, heads, seq, dim)`` before a q/k norm, as Gemma 3 does) are taken in that
order, and the results keep the input's layout.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from python_native.ops import rms_norm_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.family import Family, Op
from python_native_dsls.layout import Rows, as_rows
from python_native_dsls.proving import BenchRow, Driver, Sample, elementwise_bytes, leaf, rand

from ..plans.layout import MAX_NORM_BWD_COLS, MAX_NORM_COLS, row_fits
from ..plans.rows import NormPlan, RmsMode, norm_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
NAMESPACE = "python_native"


class ModelNormPlan(NamedTuple):
    norm: NormPlan  # of the input, its leading dims permuted by ``order``
    mode: RmsMode
    out_dtype: torch.dtype  # the forward's result
    grad_rows: Rows | None  # the backward's grad_output (permuted likewise)
    order: tuple[int, ...] | None  # None: the input's own dim order
    inverse: tuple[int, ...] | None
    copy_grad: bool = False  # grad_output's rows make no single stride in that order: copied first


def _weight_reason(input: Tensor, weight: Tensor) -> str | None:
    found = why.device(input, weight) or why.dtype(input) or why.dtype(weight, "weight dtype")
    if found:
        return found
    if weight.shape != input.shape[-1:]:
        return f"weight shape {tuple(weight.shape)} is not ({input.shape[-1] if input.ndim else 0},), the last dim"
    return None if weight.is_contiguous() else "weight is not contiguous"


def _row_order(t: Tensor) -> tuple[int, ...] | None:
    """The leading dims by decreasing stride, the normalized dim last: q or k transposed to
    ``(batch, heads, seq, dim)`` before its norm has rows that collapse to one stride in that
    order only. None where that is the tensor's own order."""
    lead = sorted(range(t.ndim - 1), key=lambda d: -t.stride(d))
    return None if lead == list(range(t.ndim - 1)) else (*lead, t.ndim - 1)


def _permuted(t: Tensor, order: tuple[int, ...] | None) -> Tensor:
    return t if order is None else t.permute(order)


def _rows(input: Tensor, backward: bool) -> tuple[NormPlan, tuple[int, ...] | None] | str:
    """The rows of ``input`` (in the dim order that makes them collapse) and that order, or why not
    (the backward streams rows longer than the forward's register tile)."""
    if not input.ndim:
        return "a 0-d input"
    max_cols = MAX_NORM_BWD_COLS if backward else MAX_NORM_COLS
    plan = norm_plan(input, input.shape[-1:], max_cols)
    order = None if plan is not None else _row_order(input)
    if order is not None:
        plan = norm_plan(input.permute(order), input.shape[-1:], max_cols)
    if plan is not None:
        return plan, order
    found = why.norm_rows(input, input.shape[-1:], backward)
    return found if found.__class__ is str else "input rows do not fit the kernels"


def _plan(rows: tuple[NormPlan, tuple[int, ...] | None], eps: float, offset: float, weight_in_fp32: bool,
          out_dtype: torch.dtype, grad_rows: Rows | None = None) -> ModelNormPlan:
    norm, order = rows
    inverse = None if order is None else tuple(order.index(d) for d in range(len(order)))
    return ModelNormPlan(norm, RmsMode(eps, offset, not weight_in_fp32), out_dtype, grad_rows, order, inverse)


def forward_plan_or_why(input: Tensor, weight: Tensor, eps: float, offset: float,
                        weight_in_fp32: bool) -> ModelNormPlan | str:
    """The launch over ``input``'s rows (in the dim order that collapses them) where the kernels take the call."""
    rows = _weight_reason(input, weight) or _rows(input, False)
    if rows.__class__ is str:
        return rows
    out = input.dtype if weight_in_fp32 else torch.promote_types(input.dtype, weight.dtype)
    return _plan(rows, eps, offset, weight_in_fp32, out)


def backward_plan_or_why(grad_output: Tensor, input: Tensor, weight: Tensor, eps: float, offset: float,
                         weight_in_fp32: bool) -> ModelNormPlan | str:
    """The same, with ``grad_output``'s rows in that order (a copy where they make no single stride)."""
    found = _weight_reason(input, weight) or why.device(grad_output) or why.dtype(grad_output, "grad_output dtype")
    if not found and grad_output.shape != input.shape:
        found = f"grad_output shape {tuple(grad_output.shape)} differs from the input's {tuple(input.shape)}"
    rows = found or _rows(input, True)
    if rows.__class__ is str:
        return rows
    grad_rows = as_rows(_permuted(grad_output, rows[1]), 1)
    if grad_rows is None:  # rows in no single stride in the input's row order: one copy, cheaper than the reference
        contiguous = rows[0].rows._replace(row_stride=rows[0].rows.n_cols, col_stride=1)
        return _plan(rows, eps, offset, weight_in_fp32, grad_output.dtype, contiguous)._replace(copy_grad=True)
    if not row_fits(grad_rows):
        return why.rows(grad_rows, "grad_output rows") or "grad_output rows do not fit the kernels"
    return _plan(rows, eps, offset, weight_in_fp32, grad_output.dtype, grad_rows)


def rms_norm_impl(input: Tensor, weight: Tensor, eps: float, offset: float = 0.0, weight_in_fp32: bool = False,
                  plan: ModelNormPlan | None = None) -> Tensor:
    plan = plan or FAMILY["rms_norm"].require(input, weight, eps, offset, weight_in_fp32)
    out = FAMILY.kernels().run_rms_norm(_permuted(input, plan.order), plan.norm, weight, plan.mode, plan.out_dtype)
    return _permuted(out, plan.inverse)


def rms_norm_backward_impl(grad_output: Tensor, input: Tensor, weight: Tensor, eps: float, offset: float,
                           weight_in_fp32: bool, plan: ModelNormPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or FAMILY["rms_norm_backward"].require(grad_output, input, weight, eps, offset, weight_in_fp32)
    grad = _permuted(grad_output, plan.order)
    grad = grad.contiguous() if plan.copy_grad else grad
    dx, dw, _ = FAMILY.kernels().backward(grad, plan.grad_rows, _permuted(input, plan.order), plan.norm.rows, None,
                                          None, weight, (True, True, False), True, None, plan.mode)
    return _permuted(dx, plan.inverse), dw


def _ops():
    return torch.ops.python_native


def _cases(dtype: torch.dtype, device: str):
    """``verify``'s cases, in each casting mode: odd widths, row slices, a q/k norm over the head dim,
    large magnitudes, a float32 weight on a half-precision input."""
    modes = {"Llama": (0.0, False), "Llama, 1 + weight": (1.0, False), "Gemma": (1.0, True)}
    inputs = {
        "odd width": rand(3, 37, dtype=dtype, device=device),
        "row slices": rand(4, 96, dtype=dtype, device=device)[:, :64],
        "q/k norm over the head dim": rand(2, 3, 4, 16, dtype=dtype, device=device),
        "1e4 scale": rand(2, 24, dtype=dtype, device=device, scale=1e4),
    }
    for (mode, (offset, fp32)), (name, x) in zip(itertools.cycle(modes.items()), inputs.items()):
        w = rand(x.shape[-1], dtype=dtype, device=device, scale=0.3)
        yield Sample(f"{mode}: {name}",
                     lambda x, w, _o=offset, _f=fp32: _ops().rms_norm(x, w, 1e-6, _o, _f), [x, w])
    x = rand(4, 40, dtype=dtype, device=device)
    yield Sample("Llama: float32 weight", lambda x, w: _ops().rms_norm(x, w, 1e-6),
                 [x, rand(40, dtype=torch.float32, device=device)])


def _inputs(gemma: bool):
    def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
        m, n = shape
        x = leaf(torch.randn(m, n, device=device, dtype=dtype), grad)
        w = leaf(torch.randn(n, device=device, dtype=dtype) * (0.1 if gemma else 1.0), grad)
        dy = torch.randn(m, n, device=device, dtype=dtype) if grad else None
        return {"x": x, "w": w, "leaves": [x, w] if grad else [], "dy": dy}
    return inputs


def _formula(offset: float, weight_in_fp32: bool):
    """The norm as transformers' modules write it: Llama's (cast back, then weighted) or Gemma's."""
    def formula(t: dict) -> Tensor:
        x, w = t["x"], t["w"]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        if weight_in_fp32:
            return (h * (offset + w.float())).to(x.dtype)
        return (w if offset == 0.0 else offset + w) * h.to(x.dtype)
    return formula


# Hidden states of 4096 to 16384 columns, and q/k norms over a head dim of 128; x, y move (backward: x,
# dy, dx too; the weight is small).
_BENCH = (
    BenchRow("rms_norm_llama", ((4, 64),), ((16384, 4096), (8192, 8192), (4096, 16384), (262144, 128)),
             _inputs(False), lambda t: _ops().rms_norm(t["x"], t["w"], 1e-6), elementwise_bytes(2, 5),
             _formula(0.0, False)),
    BenchRow("rms_norm_gemma", ((4, 64),), ((16384, 4096), (262144, 128)), _inputs(True),
             lambda t: _ops().rms_norm(t["x"], t["w"], 1e-6, 1.0, True), elementwise_bytes(2, 5),
             _formula(1.0, True)),
)

FAMILY = Family(DSL_NAME, "model_rms_norm", [
    Op("rms_norm", forward_plan_or_why, rms_norm_impl, ("input", "weight", "eps", "offset", "weight_in_fp32"),
       public_name="rms_norm", measured=False, lib=NAMESPACE, verify=Driver(_cases), bench_rows=_BENCH),
    Op("rms_norm_backward", backward_plan_or_why, rms_norm_backward_impl,
       ("grad_output", "input", "weight", "eps", "offset", "weight_in_fp32"), public_name="rms_norm",
       backward=True, measured=False, lib=NAMESPACE, bench=("rms_norm_llama", "rms_norm_gemma")),
], kernels="norm")
