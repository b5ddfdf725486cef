"""``silu``, ``gelu`` (``approximate`` 'none' or 'tanh') and their backward ops.

Accepted layouts are the dense ones (contiguous, channels-last, permuted) with every operand
sharing shape and strides; broadcasting or gappy views go to aten.
"""

from __future__ import annotations

import torch

from . import OverrideSpec
from ._layout import dense_like, fits_index, float_dtype, on_backend

Tensor = torch.Tensor

_GELU_MODES = {"none": 1, "tanh": 2}  # values match dsls.triton.kernels.activations
_SILU = 0


def _operands_ok(*tensors: Tensor) -> bool:
    first = tensors[0]
    return (
        on_backend(*tensors)
        and float_dtype(first)
        and all(t.dtype == first.dtype for t in tensors)
        and fits_index(first)
        and dense_like(first, *tensors[1:])
    )


def silu_cond(self: Tensor) -> bool:
    return _operands_ok(self)


def silu_impl(self: Tensor) -> Tensor:
    from dsls.triton.kernels import activations

    return activations.forward(self, _SILU)


def silu_backward_cond(grad_output: Tensor, self: Tensor) -> bool:
    return _operands_ok(self, grad_output)


def silu_backward_impl(grad_output: Tensor, self: Tensor) -> Tensor:
    from dsls.triton.kernels import activations

    return activations.backward(grad_output, self, _SILU)


def gelu_cond(self: Tensor, *, approximate: str) -> bool:
    return approximate in _GELU_MODES and _operands_ok(self)


def gelu_impl(self: Tensor, *, approximate: str) -> Tensor:
    from dsls.triton.kernels import activations

    return activations.forward(self, _GELU_MODES[approximate])


def gelu_backward_cond(grad_output: Tensor, self: Tensor, *, approximate: str) -> bool:
    return approximate in _GELU_MODES and _operands_ok(self, grad_output)


def gelu_backward_impl(grad_output: Tensor, self: Tensor, *, approximate: str) -> Tensor:
    from dsls.triton.kernels import activations

    return activations.backward(grad_output, self, _GELU_MODES[approximate])


OVERRIDES = [
    OverrideSpec("silu", silu_cond, silu_impl),
    OverrideSpec("silu_backward", silu_backward_cond, silu_backward_impl),
    OverrideSpec("gelu", gelu_cond, gelu_impl),
    OverrideSpec("gelu_backward", gelu_backward_cond, gelu_backward_impl),
]
