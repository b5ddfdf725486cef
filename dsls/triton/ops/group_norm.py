"""``native_group_norm`` and ``native_group_norm_backward`` on the Triton group norm kernels.

Accepted: fp32, fp16 and bf16 inputs ``N x C x *`` (any number of spatial dims, none included)
dense in the format aten gives the output (contiguous, channels-last, channels-last-3d), any
group count dividing ``C``, weight and bias absent or contiguous ``[C]`` in the input's dtype.
The backward also takes a gradient in any layout whose spatial dims collapse to one stride
(contiguous, channels-last, expanded), statistics ``[N, G]`` in the input's dtype, and any
``output_mask``. Everything else (float64, mixed parameter dtypes, non-dense inputs aten rejects,
empty batches, size arguments that do not match the input) goes to aten.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

import torch

from python_native_dsls.spec import OverrideSpec

from ..plans.group_norm import ChannelView, GroupNormPlan, group_norm_plan, plan_or_why, view_of, view_why
from ..plans.layout import on_backend
from . import why

Tensor = torch.Tensor


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import group_norm

    return group_norm


def _param_ok(p: Tensor | None, c: int, dtype: torch.dtype) -> bool:
    """Absent, or a contiguous ``[C]`` vector in the input's dtype (``why.param`` with size ``(C,)``
    spells the same checks out for traces)."""
    return p is None or (p.dtype == dtype and p.ndim == 1 and p.shape[0] == c and p.is_contiguous())


def _stats_ok(stat: Tensor, x: Tensor, n: int, groups: int) -> bool:
    return stat.dtype == x.dtype and stat.numel() == n * groups and stat.is_contiguous()


def _stats_why(stat: Tensor, what: str, x: Tensor, n: int, groups: int) -> str | None:
    """Why ``_stats_ok`` is False (None: it is True)."""
    if stat.dtype != x.dtype:
        return f"{what} dtype {why.name(stat.dtype)} differs from the input's {why.name(x.dtype)}"
    if stat.numel() != n * groups:
        return f"{what} has {stat.numel()} values for N x group = {n * groups}"
    return None if stat.is_contiguous() else f"{what} is not contiguous"


def group_norm_cond(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int, group: int, eps: float,
) -> GroupNormPlan | None:
    """The plan where the kernels take the call, else None (handed to the impl as ``plan``)."""
    if not on_backend(input, weight, bias):
        return None
    plan = group_norm_plan(input, N, C, HxW, group)
    if plan is None or not (_param_ok(weight, C, input.dtype) and _param_ok(bias, C, input.dtype)):
        return None
    return plan


def group_norm_impl(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int, group: int, eps: float,
    plan: GroupNormPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    plan = plan or group_norm_plan(input, N, C, HxW, group)
    return _kernels().run_forward(input, plan, weight, bias, eps)


def group_norm_backward_cond(
    grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None,
    N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool],
) -> tuple[GroupNormPlan, ChannelView] | None:
    """``(plan, grad_out's view)`` where the kernels take the call, else None (the impl's ``plan``)."""
    if not on_backend(grad_out, input, mean, rstd, weight) or grad_out.dtype != input.dtype:
        return None
    plan = group_norm_plan(input, N, C, HxW, group)
    if plan is None or not _param_ok(weight, C, input.dtype):
        return None
    if not (_stats_ok(mean, input, N, group) and _stats_ok(rstd, input, N, group)):
        return None
    grad_view = view_of(grad_out, N, C, HxW) if grad_out.shape == input.shape else None
    return None if grad_view is None else (plan, grad_view)


# The explanations mirror the conds check by check (the conds stay bare checks: they run on every
# call); the input's own checks are the plan builder's, which gives its reason (``plan_or_why``).
def _input_why(input: Tensor, N: int, C: int, HxW: int, group: int) -> str | None:
    found = plan_or_why(input, N, C, HxW, group, input.get_device())
    return found if found.__class__ is str else None


def group_norm_explain(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int, group: int, eps: float,
) -> str | None:
    """Why ``group_norm_cond`` declined (asked by traced calls only)."""
    return (why.device(input, weight, bias) or _input_why(input, N, C, HxW, group)
            or why.param(weight, "weight", (C,), input) or why.param(bias, "bias", (C,), input))


def group_norm_backward_explain(
    grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None,
    N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool],
) -> str | None:
    """Why ``group_norm_backward_cond`` declined."""
    found = why.device(grad_out, input, mean, rstd, weight)
    if found:
        return found
    if grad_out.dtype != input.dtype:
        return f"grad_out dtype {why.name(grad_out.dtype)} differs from the input's {why.name(input.dtype)}"
    found = (_input_why(input, N, C, HxW, group) or why.param(weight, "weight", (C,), input)
             or _stats_why(mean, "mean", input, N, group) or _stats_why(rstd, "rstd", input, N, group))
    if found:
        return found
    if grad_out.shape != input.shape:
        return f"grad_out shape {tuple(grad_out.shape)} differs from the input's {tuple(input.shape)}"
    return view_why(grad_out, N, C, HxW)


def group_norm_backward_impl(
    grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None,
    N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool],
    plan: tuple[GroupNormPlan, ChannelView] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    layout, grad_view = plan or (group_norm_plan(input, N, C, HxW, group), view_of(grad_out, N, C, HxW))
    need = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    return _kernels().backward(grad_out, grad_view, input, layout, mean, rstd, weight, need)


OVERRIDES = [
    OverrideSpec.planned("native_group_norm", group_norm_cond, group_norm_impl, measured=False,
                         public_name="group_norm", derive_variants=("out",), explain=group_norm_explain),
    OverrideSpec.planned("native_group_norm_backward", group_norm_backward_cond, group_norm_backward_impl,
                         measured=False, public_name="group_norm", backward=True, explain=group_norm_backward_explain),
]
