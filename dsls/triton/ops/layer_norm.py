"""``native_layer_norm`` and ``native_layer_norm_backward`` on the Triton row kernels."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from types import ModuleType

import torch

from python_native_dsls.layout import Rows, as_rows, param_ok
from python_native_dsls.spec import OverrideSpec, runtime_import

from ..plans.layout import MAX_NORM_BWD_COLS, on_backend, row_fits, stats_ok
from ..plans.rows import NormPlan, norm_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import norm

    return norm


def _stats_dtype(x: Tensor) -> torch.dtype:
    # aten keeps half-precision statistics in the input dtype on CPU and in fp32 on CUDA.
    return x.dtype if x.is_cpu else torch.float32


def layer_norm_cond(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> NormPlan | None:
    """The forward plan where the kernel takes the call, else None (handed to the impl as ``plan``)."""
    if not on_backend(input, weight, bias):
        return None
    plan = norm_plan(input, normalized_shape)
    if plan is None or not (
        param_ok(weight, plan.param_size, input.dtype) and param_ok(bias, plan.param_size, input.dtype)
    ):
        return None
    return plan


def layer_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float,
    plan: NormPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    plan = plan or norm_plan(input, normalized_shape)
    return _kernels().run_forward(input, plan, weight, bias, eps, _stats_dtype(input), False)


def layer_norm_backward_cond(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    output_mask: Sequence[bool],
) -> tuple[Rows, Rows] | None:
    """``(grad_out rows, input rows)`` where the kernels take the call, else None (the impl's ``plan``)."""
    if not on_backend(grad_out, input, mean, rstd, weight, bias):
        return None
    plan = norm_plan(input, normalized_shape, MAX_NORM_BWD_COLS)
    if plan is None or grad_out.dtype != input.dtype or grad_out.shape != input.shape:
        return None
    if not (param_ok(weight, plan.param_size, input.dtype) and param_ok(bias, plan.param_size, input.dtype)):
        return None
    # A parameter gradient is only asked for a parameter that exists.
    if (output_mask[1] and weight is None) or (output_mask[2] and bias is None):
        return None
    n_rows = plan.rows.n_rows
    if not (stats_ok(mean, input, n_rows) and stats_ok(rstd, input, n_rows)):
        return None
    grad_rows = as_rows(grad_out, len(normalized_shape))
    return (grad_rows, plan.rows) if row_fits(grad_rows) else None


def layer_norm_backward_impl(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    output_mask: Sequence[bool],
    plan: tuple[Rows, Rows] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    n_inner = len(normalized_shape)
    grad_rows, rows = plan or (as_rows(grad_out, n_inner), as_rows(input, n_inner))
    need = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    # The cond checked that the parameters are shaped like normalized_shape.
    dx, dw, db = _kernels().backward(
        grad_out, grad_rows, input, rows, mean, rstd, weight, need, False, tuple(normalized_shape),
    )
    if db is not None and db.dtype != bias.dtype:
        db = db.to(bias.dtype)
    return dx, dw, db


def layer_norm_explain(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> str | None:
    """Why ``layer_norm_cond`` declined (asked by traced calls only)."""
    return (why.device(input, weight, bias) or why.norm(input, normalized_shape)
            or why.param(weight, "weight", normalized_shape, input) or why.param(bias, "bias", normalized_shape, input))


def layer_norm_backward_explain(
    grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], mean: Tensor, rstd: Tensor,
    weight: Tensor | None, bias: Tensor | None, output_mask: Sequence[bool],
) -> str | None:
    """Why ``layer_norm_backward_cond`` declined."""
    found = (why.device(grad_out, input, mean, rstd, weight, bias) or why.norm(input, normalized_shape, MAX_NORM_BWD_COLS)
             or why.same(input, grad_out, "grad_out") or why.param(weight, "weight", normalized_shape, input)
             or why.param(bias, "bias", normalized_shape, input))
    if found:
        return found
    if (output_mask[1] and weight is None) or (output_mask[2] and bias is None):
        return "a gradient asked for a parameter that is None"
    n_rows = input.numel() // max(1, math.prod(normalized_shape))
    return (why.stats(mean, "mean", input, n_rows) or why.stats(rstd, "rstd", input, n_rows)
            or why.rows(as_rows(grad_out, len(normalized_shape)), "grad rows"))


OVERRIDES = [
    OverrideSpec.planned("native_layer_norm", layer_norm_cond, layer_norm_impl, public_name="layer_norm",
                          explain=layer_norm_explain, replayable=True),
    OverrideSpec.planned("native_layer_norm_backward", layer_norm_backward_cond, layer_norm_backward_impl,
                          public_name="layer_norm", backward=True, explain=layer_norm_backward_explain, replayable=True),
]
