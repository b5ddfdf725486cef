"""``silu``, ``gelu`` (``approximate`` 'none' or 'tanh') and their backward ops.

Accepted layouts are the dense ones (contiguous, channels-last, permuted) with every operand
sharing shape and strides; broadcasting or gappy views go to aten.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from . import OverrideSpec
from ._layout import FLOAT_DTYPES, dense_like, fits_index, on_backend

Tensor = torch.Tensor

_GELU_MODES = {"none": 1, "tanh": 2}  # values match python_native_dsls.triton.kernels.activations
_SILU = 0


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import activations

    return activations


def _input_ok(x: Tensor) -> bool:
    return on_backend(x) and x.dtype in FLOAT_DTYPES and fits_index(x) and dense_like(x)


def _pair_ok(x: Tensor, grad: Tensor) -> bool:
    return (
        on_backend(x, grad)
        and x.dtype in FLOAT_DTYPES
        and grad.dtype == x.dtype
        and fits_index(x)
        and dense_like(x, grad)
    )


def silu_cond(self: Tensor) -> bool:
    return _input_ok(self)


def silu_impl(self: Tensor) -> Tensor:
    return _kernels().forward(self, _SILU)


def silu_backward_cond(grad_output: Tensor, self: Tensor) -> bool:
    return _pair_ok(self, grad_output)


def silu_backward_impl(grad_output: Tensor, self: Tensor) -> Tensor:
    return _kernels().backward(grad_output, self, _SILU)


def gelu_cond(self: Tensor, *, approximate: str) -> bool:
    return approximate in _GELU_MODES and _input_ok(self)


def gelu_impl(self: Tensor, *, approximate: str) -> Tensor:
    return _kernels().forward(self, _GELU_MODES[approximate])


def gelu_backward_cond(grad_output: Tensor, self: Tensor, *, approximate: str) -> bool:
    return approximate in _GELU_MODES and _pair_ok(self, grad_output)


def gelu_backward_impl(grad_output: Tensor, self: Tensor, *, approximate: str) -> Tensor:
    return _kernels().backward(grad_output, self, _GELU_MODES[approximate])


OVERRIDES = [
    OverrideSpec("silu", silu_cond, silu_impl),
    OverrideSpec("silu_backward", silu_backward_cond, silu_backward_impl),
    OverrideSpec("gelu", gelu_cond, gelu_impl),
    OverrideSpec("gelu_backward", gelu_backward_cond, gelu_backward_impl),
]
