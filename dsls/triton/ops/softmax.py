"""``_softmax``, ``_log_softmax`` and their ``_backward_data`` ops on the Triton row kernels.

The reduced dim must be the last one that is not of size 1; the other dims must collapse to one
strided row axis. ``half_to_float`` (fp16 in, fp32 out) only exists on CUDA, where aten supports
it for fp16 inputs; the same holds here.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from . import OverrideSpec
from ._layout import float_dtype, on_backend, reduced_rows, row_fits

Tensor = torch.Tensor


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import softmax

    return softmax


def _half_to_float_ok(x: Tensor) -> bool:
    return x.dtype == torch.float16 and x.device.type == "cuda"


def softmax_cond(self: Tensor, dim: int, half_to_float: bool) -> bool:
    if not (on_backend(self) and float_dtype(self)):
        return False
    if half_to_float and not _half_to_float_ok(self):
        return False
    return row_fits(reduced_rows(self, dim))


def _softmax_impl(self: Tensor, dim: int, half_to_float: bool, *, log: bool) -> Tensor:
    out_dtype = torch.float32 if half_to_float else self.dtype
    return _kernels().forward(self, reduced_rows(self, dim), out_dtype, log)


def softmax_backward_cond(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> bool:
    if not (on_backend(grad_output, output) and float_dtype(output)):
        return False
    if grad_output.dtype != output.dtype or grad_output.shape != output.shape:
        return False
    # Either no conversion, or the backward of a half_to_float forward (fp32 grads, fp16 input).
    if input_dtype != output.dtype and not (
        output.dtype == torch.float32 and input_dtype == torch.float16 and output.device.type == "cuda"
    ):
        return False
    return row_fits(reduced_rows(output, dim)) and row_fits(reduced_rows(grad_output, dim))


def _softmax_backward_impl(
    grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype, *, log: bool
) -> Tensor:
    return _kernels().backward(
        grad_output, reduced_rows(grad_output, dim), output, reduced_rows(output, dim), input_dtype, log
    )


def softmax_impl(self: Tensor, dim: int, half_to_float: bool) -> Tensor:
    return _softmax_impl(self, dim, half_to_float, log=False)


def log_softmax_impl(self: Tensor, dim: int, half_to_float: bool) -> Tensor:
    return _softmax_impl(self, dim, half_to_float, log=True)


def softmax_backward_impl(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return _softmax_backward_impl(grad_output, output, dim, input_dtype, log=False)


def log_softmax_backward_impl(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return _softmax_backward_impl(grad_output, output, dim, input_dtype, log=True)


OVERRIDES = [
    OverrideSpec("_softmax", softmax_cond, softmax_impl),
    OverrideSpec("_log_softmax", softmax_cond, log_softmax_impl),
    OverrideSpec("_softmax_backward_data", softmax_backward_cond, softmax_backward_impl),
    OverrideSpec("_log_softmax_backward_data", softmax_backward_cond, log_softmax_backward_impl),
]
