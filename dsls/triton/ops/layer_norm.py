"""``native_layer_norm`` and ``native_layer_norm_backward`` on the Triton row kernels."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from python_native_dsls import bench_cases, norms
from python_native_dsls.family import Family, Op
from python_native_dsls.layout import Rows
from python_native_dsls.verify_cases import LAYER_NORM

from ..plans.rows import NormPlan, norm_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


def _stats_dtype(x: Tensor) -> torch.dtype:
    # aten keeps half-precision statistics in the input dtype on CPU and in fp32 on CUDA.
    return x.dtype if x.is_cpu else torch.float32


_rows_or_why, backward_plan_or_why = norms.layer_norm(why)


def forward_plan_or_why(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
                        eps: float) -> NormPlan | str:
    """The forward's launch plan where the kernels take the call, else why not."""
    found = _rows_or_why(input, normalized_shape, weight, bias, eps)
    return found if found.__class__ is str else norm_plan(input, normalized_shape)


def layer_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float,
    plan: NormPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    plan = plan or norm_plan(input, normalized_shape)
    return FAMILY.kernels().run_forward(input, plan, weight, bias, eps, _stats_dtype(input), False)


def layer_norm_backward_impl(
    grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], mean: Tensor, rstd: Tensor,
    weight: Tensor | None, bias: Tensor | None, output_mask: Sequence[bool], plan: tuple[Rows, Rows] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    grad_rows, rows = norms.backward_rows(plan, grad_out, input, normalized_shape)
    need = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    # The cond checked that the parameters are shaped like normalized_shape.
    dx, dw, db = FAMILY.kernels().backward(
        grad_out, grad_rows, input, rows, mean, rstd, weight, need, False, tuple(normalized_shape),
    )
    if db is not None and db.dtype != bias.dtype:
        db = db.to(bias.dtype)
    return dx, dw, db


FAMILY = Family(DSL_NAME, "layer_norm", [
    Op("native_layer_norm", forward_plan_or_why, layer_norm_impl,
       ("input", "tuple(normalized_shape)", "weight", "bias"), public_name="layer_norm",
       bench_rows=(bench_cases.LAYER_NORM,), replayable=True, verify=LAYER_NORM),
    Op("native_layer_norm_backward", backward_plan_or_why, layer_norm_backward_impl,
       ("grad_out", "input", "tuple(normalized_shape)", "mean", "rstd", "weight", "bias", "tuple(output_mask)"),
       public_name="layer_norm", backward=True, bench=("layer_norm",), replayable=True),
], kernels="norm")
