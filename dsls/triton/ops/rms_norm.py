"""``_fused_rms_norm`` and ``_fused_rms_norm_backward`` on the Triton row kernels.

``F.rms_norm`` reaches ``aten::rms_norm``, a composite that calls ``_fused_rms_norm`` unless the
input is channels-last, complex, or its weight has another dtype. On CUDA builds both ops have
CUDA kernels, which these override. On CPU builds ``_fused_rms_norm`` is only a composite and
``_fused_rms_norm_backward`` has no kernel at all; a CPU kernel for the forward would switch
autograd to the backward op, and with nothing to fall back to the family is not installed there
(see ``all_overrides``). Registered at the CPU key by other means, both impls serve ``F.rms_norm``.
"""

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

# aten's default when eps is None: the epsilon of the fp32 accumulation type.
DEFAULT_EPS = torch.finfo(torch.float32).eps


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import norm

    return norm


def rms_norm_cond(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> NormPlan | None:
    """The forward plan where the kernel takes the call, else None (handed to the impl as ``plan``)."""
    if not on_backend(input, weight):
        return None
    plan = norm_plan(input, normalized_shape)
    return plan if plan is not None and param_ok(weight, plan.param_size, input.dtype) else None


def rms_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None,
    plan: NormPlan | None = None,
) -> tuple[Tensor, Tensor]:
    plan = plan or norm_plan(input, normalized_shape)
    eps = DEFAULT_EPS if eps is None else eps
    y, _, rstd = _kernels().run_forward(input, plan, weight, None, eps, torch.float32, True)
    return y, rstd


def rms_norm_backward_cond(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    rstd: Tensor,
    weight: Tensor | None,
    output_mask: Sequence[bool],
) -> tuple[Rows, Rows] | None:
    """``(grad_out rows, input rows)`` where the kernels take the call, else None (the impl's ``plan``)."""
    if not on_backend(grad_out, input, rstd, weight):
        return None
    plan = norm_plan(input, normalized_shape, MAX_NORM_BWD_COLS)
    if plan is None or grad_out.dtype != input.dtype or grad_out.shape != input.shape:
        return None
    if not param_ok(weight, plan.param_size, input.dtype) or (output_mask[1] and weight is None):
        return None
    if not stats_ok(rstd, input, plan.rows.n_rows):
        return None
    grad_rows = as_rows(grad_out, len(normalized_shape))
    return (grad_rows, plan.rows) if row_fits(grad_rows) else None


def rms_norm_backward_impl(
    grad_out: Tensor,
    input: Tensor,
    normalized_shape: Sequence[int],
    rstd: Tensor,
    weight: Tensor | None,
    output_mask: Sequence[bool],
    plan: tuple[Rows, Rows] | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    n_inner = len(normalized_shape)
    grad_rows, rows = plan or (as_rows(grad_out, n_inner), as_rows(input, n_inner))
    need = (bool(output_mask[0]), bool(output_mask[1]), False)
    dx, dw, _ = _kernels().backward(
        grad_out, grad_rows, input, rows, None, rstd, weight, need, True, tuple(normalized_shape),
    )
    return dx, dw


def rms_norm_explain(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None
) -> str | None:
    """Why ``rms_norm_cond`` declined (asked by traced calls only)."""
    return why.device(input, weight) or why.norm(input, normalized_shape) or why.param(
        weight, "weight", normalized_shape, input)


def rms_norm_backward_explain(
    grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor, weight: Tensor | None,
    output_mask: Sequence[bool],
) -> str | None:
    """Why ``rms_norm_backward_cond`` declined."""
    found = (why.device(grad_out, input, rstd, weight) or why.norm(input, normalized_shape, MAX_NORM_BWD_COLS)
             or why.same(input, grad_out, "grad_out") or why.param(weight, "weight", normalized_shape, input))
    if found:
        return found
    if output_mask[1] and weight is None:
        return "a weight gradient asked for a weight that is None"
    n_rows = input.numel() // max(1, math.prod(normalized_shape))
    return why.stats(rstd, "rstd", input, n_rows) or why.rows(as_rows(grad_out, len(normalized_shape)), "grad rows")


OVERRIDES = [
    OverrideSpec.planned("_fused_rms_norm", rms_norm_cond, rms_norm_impl, public_name="rms_norm",
                          explain=rms_norm_explain, replayable=True),
    OverrideSpec.planned("_fused_rms_norm_backward", rms_norm_backward_cond, rms_norm_backward_impl,
                          public_name="rms_norm", backward=True, explain=rms_norm_backward_explain, replayable=True),
]
