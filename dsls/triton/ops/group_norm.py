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

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from python_native_dsls.bench_cases import IO_BYTES, norm_inputs
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import BOTH, BenchRow, Driver, LlmCase, Sample, Tensors, rand

from ..plans.group_norm import ChannelView, GroupNormPlan, group_norm_plan, plan_or_why, view_of, view_why
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


def _stats_why(stat: Tensor, what: str, x: Tensor, n: int, groups: int) -> str | None:
    """Saved statistics the backward kernels cannot read: ``[N, G]`` values, dense, in the input's dtype."""
    if stat.dtype != x.dtype:
        return f"{what} dtype {why.name(stat.dtype)} differs from the input's {why.name(x.dtype)}"
    if stat.numel() != n * groups:
        return f"{what} has {stat.numel()} values for N x group = {n * groups}"
    return None if stat.is_contiguous() else f"{what} is not contiguous"


def forward_plan_or_why(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int, group: int, eps: float,
) -> GroupNormPlan | str:
    """The plan where the kernels take the call, else why not (weight and bias: absent, or ``[C]``)."""
    found = why.device(input, weight, bias)
    if found:
        return found
    plan = plan_or_why(input, N, C, HxW, group, input.get_device())
    if plan.__class__ is str:
        return plan
    return why.param(weight, "weight", (C,), input) or why.param(bias, "bias", (C,), input) or plan


def backward_plan_or_why(
    grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None,
    N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool],
) -> tuple[GroupNormPlan, ChannelView] | str:
    """``(plan, grad_out's view)`` where the kernels take the call, else why not."""
    found = why.device(grad_out, input, mean, rstd, weight)
    if found:
        return found
    if grad_out.dtype != input.dtype:
        return f"grad_out dtype {why.name(grad_out.dtype)} differs from the input's {why.name(input.dtype)}"
    plan = plan_or_why(input, N, C, HxW, group, input.get_device())
    found = plan if plan.__class__ is str else (
        why.param(weight, "weight", (C,), input) or _stats_why(mean, "mean", input, N, group)
        or _stats_why(rstd, "rstd", input, N, group))
    if found:
        return found
    if grad_out.shape != input.shape:
        return f"grad_out shape {tuple(grad_out.shape)} differs from the input's {tuple(input.shape)}"
    return view_why(grad_out, N, C, HxW) or (plan, view_of(grad_out, N, C, HxW))


def group_norm_impl(
    input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int, group: int, eps: float,
    plan: GroupNormPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    plan = plan or group_norm_plan(input, N, C, HxW, group)
    return FAMILY.kernels().run_forward(input, plan, weight, bias, eps)


def group_norm_backward_impl(
    grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None,
    N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool],
    plan: tuple[GroupNormPlan, ChannelView] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    layout, grad_view = plan or (group_norm_plan(input, N, C, HxW, group), view_of(grad_out, N, C, HxW))
    need = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    return FAMILY.kernels().backward(grad_out, grad_view, input, layout, mean, rstd, weight, need)


# The plans depend on the device's index too: its SM count sizes the statistics passes.
_GROUP_NORM_CASES: list[tuple[str, tuple[int, ...], int, torch.memory_format, str]] = [
    # name, shape, groups, layout, parameters ("wb": weight and bias, "w": weight only, "": none)
    ("NCHW, odd spatial size", (2, 6, 5, 7), 3, torch.contiguous_format, "wb"),
    ("channels_last", (2, 8, 6, 6), 4, torch.channels_last, "wb"),
    ("a group per channel, weight only", (3, 4, 9), 4, torch.contiguous_format, "w"),
    ("channels_last_3d, no affine", (2, 4, 3, 3, 3), 2, torch.channels_last_3d, ""),
    ("N x C only", (5, 6), 2, torch.contiguous_format, "wb"),
    ("one group, long rows", (2, 3, 40, 40), 1, torch.contiguous_format, "wb"),
]


def _group_norm_cases(dtype: torch.dtype, device: str):
    """``verify``'s cases: layouts, group counts and affine parameters, and a large mean."""
    for name, shape, groups, layout, params in _GROUP_NORM_CASES:
        x = rand(*shape, dtype=dtype, device=device).contiguous(memory_format=layout)
        c = shape[1]
        inputs = [x] + [rand(c, dtype=dtype, device=device) for _ in params]

        def fn(t, *p, _g=groups, _params=params):
            weight = p[0] if "w" in _params else None
            bias = p[1] if "b" in _params else None
            return F.group_norm(t, _g, weight, bias, eps=1e-5)

        yield Sample(name, fn, inputs)
    offset = (rand(2, 4, 8, 8, dtype=torch.float32, device=device) * 1e2 + 1e4).to(dtype)
    yield Sample("1e4 mean, 1e2 spread", lambda t: F.group_norm(t, 2), [offset])


# Bench rows normalize 32 groups (the diffusion U-Net's), or as many as divide C.
GROUPS = 32


def _row_inputs(channels_last: bool) -> Callable[[tuple[int, ...], torch.dtype, str, bool], Tensors]:
    """An N x C x H x W ``x`` (channels-last or not), weight and bias of C, and the row's group count."""
    tensors = norm_inputs(bias=True, channel_dim=1, channels_last=channels_last)

    def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> Tensors:
        return {**tensors(shape, dtype, device, grad), "groups": math.gcd(shape[1], GROUPS)}

    return inputs


# U-Net activations (their LLM-sized row: 8 x 512 x 64 x 64), contiguous and channels-last.
_ROWS = tuple(BenchRow(name, ((2, 8, 4, 4),), ((16, 256, 32, 32), (4, 1280, 16, 16), (2, 320, 128, 128)),
                       _row_inputs(name.endswith("_cl")), lambda t: F.group_norm(t["x"], t["groups"], t["w"], t["b"]),
                       IO_BYTES, llm=tuple(LlmCase(mode, (8, 512, 64, 64), dtype) for mode in BOTH
                                           for dtype in (torch.bfloat16, torch.float32)))
              for name in ("group_norm", "group_norm_cl"))


FAMILY = Family(DSL_NAME, "group_norm", [
    Op("native_group_norm", forward_plan_or_why, group_norm_impl,
       ("input", "weight", "bias", "N", "C", "HxW", "group", "input.get_device()"), public_name="group_norm",
       measured=False, options={"derive_forms": ("out",)}, bench_rows=_ROWS,
       verify=Driver(_group_norm_cases, ("nn.functional.group_norm",), ("native_group_norm_backward",))),
    Op("native_group_norm_backward", backward_plan_or_why, group_norm_backward_impl,
       ("grad_out", "input", "mean", "rstd", "weight", "N", "C", "HxW", "group", "input.get_device()"),
       public_name="group_norm", backward=True, measured=False, bench=("group_norm", "group_norm_cl")),
], kernels="group_norm")
