"""``native_layer_norm`` and ``native_layer_norm_backward`` on the Triton row kernels."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

import torch

from . import OverrideSpec
from ._layout import MAX_NORM_BWD_COLS, as_rows, norm_plan, on_backend, param_ok, row_fits, stats_ok

Tensor = torch.Tensor


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import norm

    return norm


def _stats_dtype(x: Tensor) -> torch.dtype:
    # aten keeps half-precision statistics in the input dtype on CPU and in fp32 on CUDA.
    return x.dtype if x.is_cpu else torch.float32


def layer_norm_cond(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> bool:
    if not on_backend(input, weight, bias):
        return False
    plan = norm_plan(input, normalized_shape)
    return (
        plan is not None
        and param_ok(weight, plan.param_size, input.dtype)
        and param_ok(bias, plan.param_size, input.dtype)
    )


def layer_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    plan = norm_plan(input, normalized_shape)  # the cond's, from the layout cache
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
) -> bool:
    if not on_backend(grad_out, input, mean, rstd, weight, bias):
        return False
    plan = norm_plan(input, normalized_shape, MAX_NORM_BWD_COLS)
    if plan is None or grad_out.dtype != input.dtype or grad_out.shape != input.shape:
        return False
    if not (param_ok(weight, plan.param_size, input.dtype) and param_ok(bias, plan.param_size, input.dtype)):
        return False
    # A parameter gradient is only asked for a parameter that exists.
    if (output_mask[1] and weight is None) or (output_mask[2] and bias is None):
        return False
    n_rows = plan.rows.n_rows
    return (
        stats_ok(mean, input, n_rows)
        and stats_ok(rstd, input, n_rows)
        and row_fits(as_rows(grad_out, len(normalized_shape)))
    )


def layer_norm_backward_impl(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    output_mask: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    n_inner = len(normalized_shape)
    need = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    # The cond checked that the parameters are shaped like normalized_shape.
    dx, dw, db = _kernels().backward(
        grad_out, as_rows(grad_out, n_inner), input, as_rows(input, n_inner), mean, rstd, weight, need, False,
        tuple(normalized_shape),
    )
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    if db is not None and db.dtype != bias.dtype:
        db = db.to(bias.dtype)
    return dx, dw, db


OVERRIDES = [
    OverrideSpec("native_layer_norm", layer_norm_cond, layer_norm_impl),
    OverrideSpec("native_layer_norm_backward", layer_norm_backward_cond, layer_norm_backward_impl),
]
