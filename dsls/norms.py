"""What the norm families of both backends decide alike: layer norm's and RMS norm's checks, forward
and backward, in the order their reasons are given (metadata only, FakeTensor safe).

A backend passes its own ``why`` module, which knows its kernels' limits: ``device(*tensors)``,
``norm_rows(x, normalized_shape, backward)`` (the rows, or why not), ``stats(stat, what, x, n_rows)``
and ``rows(r, what)``, each a reason or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import torch

from python_native_dsls.layout import Rows, as_rows
from python_native_dsls.why import param, same

Tensor = torch.Tensor


def forward_rows_or_why(why: ModuleType, x: Tensor, normalized_shape: Sequence[int],
                        **params: Tensor | None) -> Rows | str:
    """``x``'s rows where the forward kernels take ``x`` and the affine ``params`` (by name), else why not."""
    found = why.device(x, *params.values())
    if found:
        return found
    rows = why.norm_rows(x, normalized_shape, False)
    if rows.__class__ is str:
        return rows
    for name, p in params.items():
        found = found or param(p, name, normalized_shape, x)
    return found or rows


def backward_plan_or_why(
    why: ModuleType, grad_out: Tensor, x: Tensor, normalized_shape: Sequence[int], output_mask: Sequence[bool],
    stats: dict[str, Tensor], params: dict[str, Tensor | None],
) -> tuple[Rows, Rows] | str:
    """``(grad_out rows, input rows)`` where the backward kernels take the call, else why not.
    ``params`` in ``output_mask`` order after the input's gradient (weight, then bias)."""
    found = why.device(grad_out, x, *stats.values(), *params.values())
    if found:
        return found
    rows = why.norm_rows(x, normalized_shape, True)
    if rows.__class__ is str:
        return rows
    found = same(x, grad_out, "grad_out")
    for name, p in params.items():
        found = found or param(p, name, normalized_shape, x)
    if found:
        return found
    # A parameter gradient is only asked for a parameter that exists.
    for i, (name, p) in enumerate(params.items(), 1):
        if output_mask[i] and p is None:
            return f"a gradient asked for the {name}, which is None"
    for name, stat in stats.items():
        found = found or why.stats(stat, name, x, rows.n_rows)
    grad_rows = as_rows(grad_out, len(normalized_shape))
    return found or why.rows(grad_rows, "grad rows") or (grad_rows, rows)


def layer_norm(why: ModuleType) -> tuple[Callable[..., Rows | str], Callable[..., tuple[Rows, Rows] | str]]:
    """``(forward, backward)`` checks of ``native_layer_norm`` and its backward, with the ops' own
    parameters: the input's rows (forward), ``(grad_out rows, input rows)`` (backward), or why not."""

    def forward(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
                eps: float) -> Rows | str:
        return forward_rows_or_why(why, input, normalized_shape, weight=weight, bias=bias)

    def backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], mean: Tensor, rstd: Tensor,
                 weight: Tensor | None, bias: Tensor | None, output_mask: Sequence[bool]) -> tuple[Rows, Rows] | str:
        return backward_plan_or_why(why, grad_out, input, normalized_shape, output_mask,
                                    {"mean": mean, "rstd": rstd}, {"weight": weight, "bias": bias})

    return forward, backward


def rms_norm(why: ModuleType) -> tuple[Callable[..., Rows | str], Callable[..., tuple[Rows, Rows] | str]]:
    """``(forward, backward)`` checks of ``_fused_rms_norm`` and its backward, as ``layer_norm``'s."""

    def forward(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None) -> Rows | str:
        return forward_rows_or_why(why, input, normalized_shape, weight=weight)

    def backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor,
                 weight: Tensor | None, output_mask: Sequence[bool]) -> tuple[Rows, Rows] | str:
        return backward_plan_or_why(why, grad_out, input, normalized_shape, output_mask, {"rstd": rstd},
                                    {"weight": weight})

    return forward, backward


def backward_rows(plan: tuple[Rows, Rows] | None, grad_out: Tensor, x: Tensor,
                  normalized_shape: Sequence[int]) -> tuple[Rows, Rows]:
    """A backward impl's ``(grad_out rows, input rows)``: its plan's, or (called without one) the layout's."""
    n_inner = len(normalized_shape)
    return plan or (as_rows(grad_out, n_inner), as_rows(x, n_inner))
