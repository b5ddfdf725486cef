"""``native_layer_norm`` and ``native_layer_norm_backward`` on the CuTe DSL norm kernels (CUDA only).

Statistics are fp32 whatever the input dtype, as aten's CUDA kernels keep them.
"""

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


def _flags(weight: Tensor | None, bias: Tensor | None) -> tuple[str, ...]:
    return tuple(name for name, p in (("weight", weight), ("bias", bias)) if p is not None)


def layer_norm_cond(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> bool:
    return (
        on_cuda(input, weight, bias)
        and norm_rows(input, normalized_shape) is not None
        and is_param(weight, normalized_shape, input.dtype)
        and is_param(bias, normalized_shape, input.dtype)
    )


def layer_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    n_inner = len(normalized_shape)
    rows = as_rows(input, n_inner)
    flags = _flags(weight, bias) + vector_flags(rows, input, weight, bias)
    run = launcher("norm_forward", input.dtype, input.dtype, rows.n_cols, input, *flags)
    y = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    mean = torch.empty(rows.n_rows, device=input.device, dtype=torch.float32)
    rstd = torch.empty(rows.n_rows, device=input.device, dtype=torch.float32)
    absent = placeholder(input, input.dtype)
    run(
        matrix(input, rows),
        absent if weight is None else weight,
        absent if bias is None else bias,
        y,
        mean,
        rstd,
        float(eps),
    )
    shape = stat_shape(input, input.ndim - n_inner)
    return y.view(input.shape), mean.view(shape), rstd.view(shape)


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
    if not on_cuda(grad_out, input, mean, rstd, weight, bias):
        return False
    rows = norm_rows(input, normalized_shape)
    if rows is None or grad_out.dtype != input.dtype or grad_out.shape != input.shape:
        return False
    if not (is_param(weight, normalized_shape, input.dtype) and is_param(bias, normalized_shape, input.dtype)):
        return False
    if (output_mask[1] and weight is None) or (output_mask[2] and bias is None):
        return False
    return (
        fp32_stats(mean, rows.n_rows)
        and fp32_stats(rstd, rows.n_rows)
        and unit_rows(as_rows(grad_out, len(normalized_shape)))
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
    rows = as_rows(input, n_inner)
    run = launcher("norm_backward", input.dtype, input.dtype, rows.n_cols, input, *_flags(weight, bias))
    dx = torch.empty((rows.n_rows, rows.n_cols), device=input.device, dtype=input.dtype)
    n_ctas = backward_ctas(input, rows.n_rows)

    def partials(p: Tensor | None) -> Tensor:
        if p is None:
            return placeholder(input, torch.float32, 2)
        return torch.zeros((n_ctas, rows.n_cols), device=input.device, dtype=torch.float32)

    dw_part, db_part = partials(weight), partials(bias)
    run(
        matrix(grad_out, as_rows(grad_out, n_inner)),
        matrix(input, rows),
        placeholder(input, input.dtype) if weight is None else weight,
        mean.view(rows.n_rows),
        rstd.view(rows.n_rows),
        dx,
        dw_part,
        db_part,
        n_ctas,
    )
    dw = dw_part.sum(0).view(weight.shape).to(weight.dtype) if output_mask[1] and weight is not None else None
    db = db_part.sum(0).view(bias.shape).to(bias.dtype) if output_mask[2] and bias is not None else None
    return (dx.view(input.shape) if output_mask[0] else None), dw, db


OVERRIDES = [
    OverrideSpec("native_layer_norm", layer_norm_cond, layer_norm_impl, public_name="layer_norm"),
    OverrideSpec("native_layer_norm_backward", layer_norm_backward_cond, layer_norm_backward_impl,
                 public_name="layer_norm", backward=True),
]


def precompile_variants() -> list[tuple[str, str, object]]:
    """Every dtype and size class, affine (weight and bias) and plain; the forward also vectorized."""
    from ..variant import Variant

    out = []
    for dtype in DTYPE_NAMES.values():
        for cls, _, _ in SIZE_CLASSES:
            for flags in (("weight", "bias"), ()):
                for vec in ((), ("vec",)):
                    variant = Variant("norm_forward", dtype, dtype, threads_of(cls), frozenset(flags + vec))
                    out.append(("native_layer_norm", cls, variant))
                variant = Variant("norm_backward", dtype, dtype, threads_of(cls), frozenset(flags))
                out.append(("native_layer_norm_backward", cls, variant))
    return out
