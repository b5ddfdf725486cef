"""``python_native::rms_norm`` and its backward on the Triton norm row kernels.

The op is declared by ``python_native.ops``: the RMS norm transformers' modules write by hand, in
their casting modes. Llama's (``weight_in_fp32`` off) normalizes in fp32, casts back to the
input's dtype, then multiplies by ``weight`` (or ``offset + weight`` in the weight's dtype): the
result's dtype promotes. Gemma's (``weight_in_fp32``) multiplies by ``offset + weight.float()`` in
fp32 and casts the product back. The kernels are those of ``_fused_rms_norm`` with the weight
offset and the casting rule as parameters (``kernels.norm``); the forward keeps no statistics,
and the backward (gradients computed in fp32) recomputes each row's rstd from the input.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import NamedTuple

import torch

from python_native.ops import rms_norm_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.layout import Rows, as_rows
from python_native_dsls.spec import runtime_import

from ..plans.layout import MAX_NORM_BWD_COLS, MAX_NORM_COLS, row_fits
from ..plans.rows import NormPlan, RmsMode, norm_plan
from ..target import DSL_NAME
from . import why
from .planned import PlanOrReason, declared_spec

Tensor = torch.Tensor


class ModelNormPlan(NamedTuple):
    norm: NormPlan
    mode: RmsMode
    out_dtype: torch.dtype  # the forward's result
    grad_rows: Rows | None  # the backward's grad_output


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import norm

    return norm


def _weight_reason(input: Tensor, weight: Tensor) -> str | None:
    found = why.device(input, weight) or why.dtype(input) or why.dtype(weight, "weight dtype")
    if found:
        return found
    if weight.shape != input.shape[-1:]:
        return f"weight shape {tuple(weight.shape)} is not ({input.shape[-1] if input.ndim else 0},), the last dim"
    return None if weight.is_contiguous() else "weight is not contiguous"


def _rows(input: Tensor, max_cols: int) -> NormPlan | str:
    plan = norm_plan(input, input.shape[-1:], max_cols) if input.ndim else None
    return plan or why.norm(input, input.shape[-1:], max_cols) or "input rows do not fit the kernels"


def _forward(input: Tensor, weight: Tensor, eps: float, offset: float, weight_in_fp32: bool) -> ModelNormPlan | str:
    found = _weight_reason(input, weight)
    plan = found or _rows(input, MAX_NORM_COLS)
    if isinstance(plan, str):
        return plan
    out = input.dtype if weight_in_fp32 else torch.promote_types(input.dtype, weight.dtype)
    return ModelNormPlan(plan, RmsMode(eps, offset, not weight_in_fp32), out, None)


def _backward(grad_output: Tensor, input: Tensor, weight: Tensor, eps: float, offset: float,
              weight_in_fp32: bool) -> ModelNormPlan | str:
    found = _weight_reason(input, weight) or why.device(grad_output) or why.dtype(grad_output, "grad_output dtype")
    if not found and grad_output.shape != input.shape:
        found = f"grad_output shape {tuple(grad_output.shape)} differs from the input's {tuple(input.shape)}"
    plan = found or _rows(input, MAX_NORM_BWD_COLS)
    if isinstance(plan, str):
        return plan
    grad_rows = as_rows(grad_output, 1)
    if not row_fits(grad_rows):
        return why.rows(grad_rows, "grad_output rows") or "grad_output rows do not fit the kernels"
    return ModelNormPlan(plan, RmsMode(eps, offset, not weight_in_fp32), grad_output.dtype, grad_rows)


RMS_NORM = PlanOrReason(_forward)
RMS_NORM_BACKWARD = PlanOrReason(_backward)


def rms_norm_impl(input: Tensor, weight: Tensor, eps: float, offset: float = 0.0, weight_in_fp32: bool = False,
                  plan: ModelNormPlan | None = None) -> Tensor:
    plan = plan or RMS_NORM.require(input, weight, eps, offset, weight_in_fp32)
    return _kernels().run_rms_norm(input, plan.norm, weight, plan.mode, plan.out_dtype)


def rms_norm_backward_impl(grad_output: Tensor, input: Tensor, weight: Tensor, eps: float, offset: float,
                           weight_in_fp32: bool, plan: ModelNormPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or RMS_NORM_BACKWARD.require(grad_output, input, weight, eps, offset, weight_in_fp32)
    dx, dw, _ = _kernels().backward(grad_output, plan.grad_rows, input, plan.norm.rows, None, None, weight,
                                    (True, True, False), True, None, plan.mode)
    return dx, dw


OVERRIDES = [
    declared_spec("rms_norm", RMS_NORM, rms_norm_impl, "rms_norm"),
    declared_spec("rms_norm_backward", RMS_NORM_BACKWARD, rms_norm_backward_impl, "rms_norm", backward=True),
]
