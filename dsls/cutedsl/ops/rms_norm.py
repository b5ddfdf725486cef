"""``_fused_rms_norm`` and ``_fused_rms_norm_backward`` on the CuTe DSL norm kernels (CUDA only)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from python_native_dsls.spec import OverrideSpec

from ._rows import (
    DTYPE_NAMES,
    SIZE_CLASSES,
    as_rows,
    backward_ctas,
    fp32_stats,
    is_param,
    launcher,
    matrix,
    norm_rows,
    on_cuda,
    placeholder,
    stat_shape,
    threads_of,
    unit_rows,
    vector_flags,
)

Tensor = torch.Tensor

DEFAULT_EPS = torch.finfo(torch.float32).eps  # aten's default when eps is None


def rms_norm_cond(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None) -> bool:
    return (
        on_cuda(input, weight)
        and norm_rows(input, normalized_shape) is not None
        and is_param(weight, normalized_shape, input.dtype)
    )


def rms_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> tuple[Tensor, Tensor]:
    n_inner = len(normalized_shape)
    rows = as_rows(input, n_inner)
    flags = ("rms", "weight") if weight is not None else ("rms",)
    flags += vector_flags(rows, input, weight)
    run = launcher("norm_forward", input.dtype, input.dtype, rows.n_cols, input, *flags)
    y = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    rstd = torch.empty(rows.n_rows, device=input.device, dtype=torch.float32)
    w = weight if weight is not None else placeholder(input, input.dtype)
    stats = placeholder(input, torch.float32)
    run(matrix(input, rows), w, w, y, stats, rstd, DEFAULT_EPS if eps is None else float(eps))
    return y.view(input.shape), rstd.view(stat_shape(input, input.ndim - n_inner))


def rms_norm_backward_cond(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    rstd: Tensor,
    weight: Tensor | None,
    output_mask: Sequence[bool],
) -> bool:
    if not on_cuda(grad_out, input, rstd, weight):
        return False
    rows = norm_rows(input, normalized_shape)
    if rows is None or grad_out.dtype != input.dtype or grad_out.shape != input.shape:
        return False
    if not is_param(weight, normalized_shape, input.dtype) or (output_mask[1] and weight is None):
        return False
    return fp32_stats(rstd, rows.n_rows) and unit_rows(as_rows(grad_out, len(normalized_shape)))


def rms_norm_backward_impl(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    rstd: Tensor,
    weight: Tensor | None,
    output_mask: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None]:
    n_inner = len(normalized_shape)
    rows = as_rows(input, n_inner)
    flags = ("rms", "weight") if weight is not None else ("rms",)
    run = launcher("norm_backward", input.dtype, input.dtype, rows.n_cols, input, *flags)
    dx = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    n_ctas = backward_ctas(input, rows.n_rows)
    if weight is not None:
        dw_part = torch.zeros((n_ctas, rows.n_cols), device=input.device, dtype=torch.float32)
        w = weight
    else:
        dw_part, w = placeholder(input, torch.float32, 2), placeholder(input, input.dtype)
    run(
        matrix(grad_out, as_rows(grad_out, n_inner)),
        matrix(input, rows),
        w,
        placeholder(input, torch.float32),
        rstd.view(rows.n_rows),
        dx,
        dw_part,
        placeholder(input, torch.float32, 2),
        n_ctas,
    )
    dw = dw_part.sum(0).view(weight.shape).to(weight.dtype) if output_mask[1] and weight is not None else None
    return (dx.view(input.shape) if output_mask[0] else None), dw


OVERRIDES = [
    OverrideSpec("_fused_rms_norm", rms_norm_cond, rms_norm_impl, public_name="rms_norm"),
    OverrideSpec("_fused_rms_norm_backward", rms_norm_backward_cond, rms_norm_backward_impl,
                 public_name="rms_norm", backward=True),
]


def precompile_variants() -> list[tuple[str, str, object]]:
    """Every dtype and size class, with and without a weight; the forward also vectorized."""
    from ..variant import Variant

    out = []
    for dtype in DTYPE_NAMES.values():
        for cls, _, _ in SIZE_CLASSES:
            for flags in (("rms", "weight"), ("rms",)):
                for vec in ((), ("vec",)):
                    variant = Variant("norm_forward", dtype, dtype, threads_of(cls), frozenset(flags + vec))
                    out.append(("_fused_rms_norm", cls, variant))
                variant = Variant("norm_backward", dtype, dtype, threads_of(cls), frozenset(flags))
                out.append(("_fused_rms_norm_backward", cls, variant))
    return out
