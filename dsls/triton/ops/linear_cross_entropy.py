"""``python_native::linear_cross_entropy`` (forward and backward) on the Triton cross-entropy kernels.

The op is declared by ``python_native.ops``; these overrides shadow its chunked reference at the
backend key. They run the same chunk loops (``python_native.ops.cross_entropy_chunks``: a GEMM per
chunk of logits, never the whole matrix) with Triton kernels doing each chunk's row work in one
pass and in place, where the reference spends several chunk-sized temporaries in plain torch.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.ops import linear_cross_entropy_op as op
from python_native_dsls.spec import OverrideSpec

from ..plans.layout import on_backend

Tensor = torch.Tensor

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NAMESPACE = "python_native"


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first call rather than with the op."""
    from python_native_dsls.triton.kernels import cross_entropy

    return cross_entropy


def _shapes_ok(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None) -> bool:
    """What the kernels take: 2-D input and weight of one kernel dtype, 1-D int64 targets (metadata only)."""
    dtype = input.dtype
    return (
        dtype in DTYPES and weight.dtype == dtype and input.dim() == 2 and weight.dim() == 2
        and input.shape[1] == weight.shape[1] and 0 < weight.shape[0] < 2**31
        and target.dim() == 1 and target.shape[0] == input.shape[0] and target.dtype == torch.int64
        and (bias is None or (bias.dtype == dtype and bias.dim() == 1 and bias.shape[0] == weight.shape[0]))
        and on_backend(input, weight, target, bias)
    )


def forward_cond(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str,
                 ignore_index: int, label_smoothing: float) -> bool:
    return reduction in op.REDUCTIONS and 0.0 <= label_smoothing <= 1.0 and _shapes_ok(input, weight, target, bias)


def forward_impl(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str,
                 ignore_index: int, label_smoothing: float) -> tuple[Tensor, Tensor]:
    return op.run_forward(input, weight, target, bias, reduction, ignore_index, label_smoothing,
                          _kernels().forward_rows)


def backward_cond(grad: Tensor, input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor,
                  reduction: str, ignore_index: int, label_smoothing: float, output_mask: list[bool]) -> bool:
    return (
        reduction in op.REDUCTIONS and _shapes_ok(input, weight, target, bias)
        and lse.dtype == torch.float32 and lse.shape == target.shape and on_backend(grad, lse)
    )


def backward_impl(grad: Tensor, input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor,
                  reduction: str, ignore_index: int, label_smoothing: float, output_mask: list[bool],
                  ) -> tuple[Tensor, Tensor, Tensor]:
    return op.run_backward(grad, input, weight, target, bias, lse, reduction, ignore_index, label_smoothing,
                           output_mask, _kernels().backward_rows)


OVERRIDES = [
    OverrideSpec("linear_cross_entropy.forward", forward_cond, forward_impl, lib=NAMESPACE),
    OverrideSpec("linear_cross_entropy.backward", backward_cond, backward_impl, lib=NAMESPACE),
]
