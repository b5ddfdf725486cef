"""``native_layer_norm`` and ``native_layer_norm_backward`` on the CuTe DSL norm kernels (CUDA only).

Statistics are fp32 whatever the input dtype, as aten's CUDA kernels keep them. The plans are the
input's row view (forward), and the gradient's and the input's (backward).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from python_native_dsls import bench_cases, norms
from python_native_dsls.family import Family, Op
from python_native_dsls.verify_cases import LAYER_NORM

from ..target import DSL_NAME
from . import why
from ._norms import norm_specializations, param_grad, partial_sums
from ._rows import KERNELS, Rows, as_rows, backward_ctas, launcher, matrix, placeholder, stat_shape, vector_flags

Tensor = torch.Tensor


def _flags(weight: Tensor | None, bias: Tensor | None) -> tuple[str, ...]:
    return tuple(name for name, p in (("weight", weight), ("bias", bias)) if p is not None)


forward_plan_or_why, backward_plan_or_why = norms.layer_norm(why)


def layer_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float,
    plan: Rows | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    n_inner = len(normalized_shape)
    rows = plan or as_rows(input, n_inner)
    flags = _flags(weight, bias) + vector_flags(rows, input, weight, bias)
    run = launcher("norm_forward", input.dtype, input.dtype, rows.n_cols, input, *flags)
    y = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    mean = torch.empty(rows.n_rows, device=input.device, dtype=torch.float32)
    rstd = torch.empty(rows.n_rows, device=input.device, dtype=torch.float32)
    absent = placeholder(input, input.dtype)
    run(matrix(input, rows), absent if weight is None else weight, absent if bias is None else bias, y, mean, rstd,
        float(eps))
    shape = stat_shape(input, input.ndim - n_inner)
    return y.view(input.shape), mean.view(shape), rstd.view(shape)


def layer_norm_backward_impl(
    grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], mean: Tensor, rstd: Tensor,
    weight: Tensor | None, bias: Tensor | None, output_mask: Sequence[bool], plan: tuple[Rows, Rows] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    grad_rows, rows = norms.backward_rows(plan, grad_out, input, normalized_shape)
    run = launcher("norm_backward", input.dtype, input.dtype, rows.n_cols, input, *_flags(weight, bias))
    dx = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    n_ctas = backward_ctas(input, rows.n_rows)
    dw_part, db_part = partial_sums(input, rows, n_ctas, weight), partial_sums(input, rows, n_ctas, bias)
    run(matrix(grad_out, grad_rows), matrix(input, rows), placeholder(input, input.dtype) if weight is None else weight,
        mean.view(rows.n_rows), rstd.view(rows.n_rows), dx, dw_part, db_part, n_ctas)
    dw, db = param_grad(dw_part, weight, output_mask[1]), param_grad(db_part, bias, output_mask[2])
    return (dx.view(input.shape) if output_mask[0] else None), dw, db


FAMILY = Family(DSL_NAME, "layer_norm", [
    Op("native_layer_norm", forward_plan_or_why, layer_norm_impl,
       ("input", "tuple(normalized_shape)", "weight", "bias", "input.get_device()"), public_name="layer_norm",
       bench_rows=(bench_cases.LAYER_NORM,), verify=LAYER_NORM),
    Op("native_layer_norm_backward", backward_plan_or_why, layer_norm_backward_impl,
       ("grad_out", "input", "tuple(normalized_shape)", "mean", "rstd", "weight", "bias", "tuple(output_mask)",
        "input.get_device()"), public_name="layer_norm", backward=True, bench=("layer_norm",)),
], kernels=KERNELS)


def precompile_specializations() -> list[tuple[str, str, object]]:
    """Every dtype and size class, affine (weight and bias) and plain; the forward also vectorized."""
    return norm_specializations("native_layer_norm", "native_layer_norm_backward", (("weight", "bias"), ()))
