"""``_fused_rms_norm`` and ``_fused_rms_norm_backward`` on the Triton row kernels.

``F.rms_norm`` reaches ``aten::rms_norm``, a composite that calls ``_fused_rms_norm`` unless the
input is channels-last, complex, or its weight has another dtype. On CUDA builds both ops have
CUDA kernels, which these override. On CPU builds ``_fused_rms_norm`` is only a composite and
``_fused_rms_norm_backward`` has no kernel at all; a CPU kernel for the forward would switch
autograd to the backward op, and with nothing to fall back to the family is not installed there
(see ``all_overrides``). Registered at the CPU key by other means, both impls serve ``F.rms_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from python_native_dsls import bench_cases, norms
from python_native_dsls.constants import DEFAULT_EPS
from python_native_dsls.family import Family, Op
from python_native_dsls.layout import Rows
from python_native_dsls.verify_cases import RMS_NORM

from ..plans.rows import NormPlan, norm_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


_rows_or_why, backward_plan_or_why = norms.rms_norm(why)


def forward_plan_or_why(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None,
                        eps: float | None) -> NormPlan | str:
    """The forward's launch plan where the kernels take the call, else why not."""
    found = _rows_or_why(input, normalized_shape, weight, eps)
    return found if found.__class__ is str else norm_plan(input, normalized_shape)


def rms_norm_impl(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None,
    plan: NormPlan | None = None,
) -> tuple[Tensor, Tensor]:
    plan = plan or norm_plan(input, normalized_shape)
    eps = DEFAULT_EPS if eps is None else eps
    y, _, rstd = FAMILY.kernels().run_forward(input, plan, weight, None, eps, torch.float32, True)
    return y, rstd


def rms_norm_backward_impl(
    grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor, weight: Tensor | None,
    output_mask: Sequence[bool], plan: tuple[Rows, Rows] | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    grad_rows, rows = norms.backward_rows(plan, grad_out, input, normalized_shape)
    need = (bool(output_mask[0]), bool(output_mask[1]), False)
    dx, dw, _ = FAMILY.kernels().backward(
        grad_out, grad_rows, input, rows, None, rstd, weight, need, True, tuple(normalized_shape),
    )
    return dx, dw


FAMILY = Family(DSL_NAME, "rms_norm", [
    Op("_fused_rms_norm", forward_plan_or_why, rms_norm_impl, ("input", "tuple(normalized_shape)", "weight"),
       public_name="rms_norm", bench_rows=(bench_cases.RMS_NORM,), replayable=True, verify=RMS_NORM),
    Op("_fused_rms_norm_backward", backward_plan_or_why, rms_norm_backward_impl,
       ("grad_out", "input", "tuple(normalized_shape)", "rstd", "weight", "tuple(output_mask)"),
       public_name="rms_norm", backward=True, bench=("rms_norm",), replayable=True),
], kernels="norm")
