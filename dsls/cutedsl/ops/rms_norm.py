"""``_fused_rms_norm`` and ``_fused_rms_norm_backward`` on the CuTe DSL norm kernels (CUDA only).

The plans are the input's row view (forward), and the gradient's and the input's (backward).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from python_native_dsls import bench_cases, norms
from python_native_dsls.constants import DEFAULT_EPS
from python_native_dsls.family import Family, Op
from python_native_dsls.verify_cases import RMS_NORM

from ..target import DSL_NAME
from . import why
from ._norms import norm_specializations, param_grad, partial_sums
from ._rows import KERNELS, Rows, as_rows, backward_ctas, launcher, matrix, placeholder, stat_shape, vector_flags

Tensor = torch.Tensor


forward_plan_or_why, backward_plan_or_why = norms.rms_norm(why)


def rms_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None,
    plan: Rows | None = None,
) -> tuple[Tensor, Tensor]:
    n_inner = len(normalized_shape)
    rows = plan or as_rows(input, n_inner)
    flags = ("rms", "weight") if weight is not None else ("rms",)
    flags += vector_flags(rows, input, weight)
    run = launcher("norm_forward", input.dtype, input.dtype, rows.n_cols, input, *flags)
    y = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    rstd = torch.empty(rows.n_rows, device=input.device, dtype=torch.float32)
    w = weight if weight is not None else placeholder(input, input.dtype)
    stats = placeholder(input, torch.float32)
    run(matrix(input, rows), w, w, y, stats, rstd, DEFAULT_EPS if eps is None else float(eps))
    return y.view(input.shape), rstd.view(stat_shape(input, input.ndim - n_inner))


def rms_norm_backward_impl(
    grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor, weight: Tensor | None,
    output_mask: Sequence[bool], plan: tuple[Rows, Rows] | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    grad_rows, rows = norms.backward_rows(plan, grad_out, input, normalized_shape)
    flags = ("rms", "weight") if weight is not None else ("rms",)
    run = launcher("norm_backward", input.dtype, input.dtype, rows.n_cols, input, *flags)
    dx = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    n_ctas = backward_ctas(input, rows.n_rows)
    dw_part = partial_sums(input, rows, n_ctas, weight)
    w = weight if weight is not None else placeholder(input, input.dtype)
    run(matrix(grad_out, grad_rows), matrix(input, rows), w, placeholder(input, torch.float32),
        rstd.view(rows.n_rows), dx, dw_part, placeholder(input, torch.float32, 2), n_ctas)
    return (dx.view(input.shape) if output_mask[0] else None), param_grad(dw_part, weight, output_mask[1])


FAMILY = Family(DSL_NAME, "rms_norm", [
    Op("_fused_rms_norm", forward_plan_or_why, rms_norm_impl,
       ("input", "tuple(normalized_shape)", "weight", "input.get_device()"), public_name="rms_norm",
       bench_rows=(bench_cases.RMS_NORM,), verify=RMS_NORM),
    Op("_fused_rms_norm_backward", backward_plan_or_why, rms_norm_backward_impl,
       ("grad_out", "input", "tuple(normalized_shape)", "rstd", "weight", "tuple(output_mask)", "input.get_device()"),
       public_name="rms_norm", backward=True, bench=("rms_norm",)),
], kernels=KERNELS)


def precompile_specializations() -> list[tuple[str, str, object]]:
    """Every dtype and size class, with and without a weight; the forward also vectorized."""
    return norm_specializations("_fused_rms_norm", "_fused_rms_norm_backward", (("rms", "weight"), ("rms",)))
