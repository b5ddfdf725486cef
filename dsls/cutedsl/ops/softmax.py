"""``_softmax``, ``_log_softmax`` and their ``_backward_data`` ops on the CuTe DSL row kernels (CUDA only).

The reduced dim must be the last one not of size 1, with unit stride; the other dims must collapse
to one strided row axis. ``half_to_float`` (fp16 in, fp32 out) is accepted as aten's CUDA kernel
accepts it.
"""

from __future__ import annotations

import torch

from python_native_dsls.spec import OverrideSpec

from ._rows import (
    DTYPE_NAMES,
    SIZE_CLASSES,
    float_dtype,
    launcher,
    matrix,
    on_cuda,
    reduced_rows,
    threads_of,
    unit_rows,
    vector_flags,
)

Tensor = torch.Tensor


def softmax_cond(self: Tensor, dim: int, half_to_float: bool) -> bool:
    if not (on_cuda(self) and float_dtype(self)):
        return False
    if half_to_float and self.dtype != torch.float16:
        return False
    return unit_rows(reduced_rows(self, dim))


def _forward(self: Tensor, dim: int, half_to_float: bool, log: bool) -> Tensor:
    rows = reduced_rows(self, dim)
    out_dtype = torch.float32 if half_to_float else self.dtype
    flags = (("log",) if log else ()) + vector_flags(rows, self)
    run = launcher("softmax_forward", self.dtype, out_dtype, rows.n_cols, self, *flags)
    y = torch.empty((rows.n_rows, rows.n_cols), device=self.device, dtype=out_dtype)
    run(matrix(self, rows), y)
    return y.view(self.shape)


def softmax_impl(self: Tensor, dim: int, half_to_float: bool) -> Tensor:
    return _forward(self, dim, half_to_float, log=False)


def log_softmax_impl(self: Tensor, dim: int, half_to_float: bool) -> Tensor:
    return _forward(self, dim, half_to_float, log=True)


def softmax_backward_cond(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> bool:
    if not (on_cuda(grad_output, output) and float_dtype(output)):
        return False
    if grad_output.dtype != output.dtype or grad_output.shape != output.shape:
        return False
    # No conversion, or the backward of a half_to_float forward (fp32 grads, fp16 input).
    if input_dtype != output.dtype and not (output.dtype == torch.float32 and input_dtype == torch.float16):
        return False
    return unit_rows(reduced_rows(output, dim)) and unit_rows(reduced_rows(grad_output, dim))


def _backward(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype, log: bool) -> Tensor:
    rows = reduced_rows(output, dim)
    run = launcher("softmax_backward", output.dtype, input_dtype, rows.n_cols, output, *(("log",) if log else ()))
    dx = torch.empty((rows.n_rows, rows.n_cols), device=output.device, dtype=input_dtype)
    run(matrix(grad_output, reduced_rows(grad_output, dim)), matrix(output, rows), dx)
    return dx.view(output.shape)


def softmax_backward_impl(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return _backward(grad_output, output, dim, input_dtype, log=False)


def log_softmax_backward_impl(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return _backward(grad_output, output, dim, input_dtype, log=True)


OVERRIDES = [
    OverrideSpec("_softmax", softmax_cond, softmax_impl, public_name="softmax"),
    OverrideSpec("_log_softmax", softmax_cond, log_softmax_impl, public_name="log_softmax"),
    OverrideSpec("_softmax_backward_data", softmax_backward_cond, softmax_backward_impl,
                 public_name="softmax", backward=True),
    OverrideSpec("_log_softmax_backward_data", softmax_backward_cond, log_softmax_backward_impl,
                 public_name="log_softmax", backward=True),
]


def precompile_variants() -> list[tuple[str, str, object]]:
    """Every dtype and size class, softmax and log-softmax, plus the fp16 -> fp32 (half_to_float) pair."""
    from ..variant import Variant

    pairs = [(d, d) for d in DTYPE_NAMES.values()] + [("float16", "float32")]
    out = []
    for dtype, wide in pairs:
        for cls, _, _ in SIZE_CLASSES:
            for log, (fwd, bwd) in ((False, ("_softmax", "_softmax_backward_data")),
                                    (True, ("_log_softmax", "_log_softmax_backward_data"))):
                flags = frozenset({"log"}) if log else frozenset()
                for vec in (frozenset(), frozenset({"vec"})):
                    out.append((fwd, cls, Variant("softmax_forward", dtype, wide, threads_of(cls), flags | vec)))
                # the backward reads the forward's output (``wide``) and writes the input dtype
                out.append((bwd, cls, Variant("softmax_backward", wide, dtype, threads_of(cls), flags)))
    return out
