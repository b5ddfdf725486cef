"""``_softmax``, ``_log_softmax`` and their ``_backward_data`` ops on the CuTe DSL row kernels (CUDA only).

The reduced dim must be the last one not of size 1, with unit stride; the other dims must collapse
to one strided row axis. ``half_to_float`` (fp16 in, fp32 out) is accepted as aten's CUDA kernel
accepts it. The plans are the row views (forward), and those of the output and its gradient
(backward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native_dsls import bench_cases
from python_native_dsls.family import Family, Op
from python_native_dsls.verify_cases import LOG_SOFTMAX, SOFTMAX

from ..target import DSL_NAME
from . import why
from ._rows import DTYPE_NAMES, KERNELS, SIZE_CLASSES, Rows, launcher, matrix, reduced_rows, threads_of, vector_flags

Tensor = torch.Tensor


def forward_plan_or_why(self: Tensor, dim: int, half_to_float: bool) -> Rows | str:
    found = why.device(self) or why.dtype(self)
    if found:
        return found
    if half_to_float and self.dtype != torch.float16:
        return "half_to_float needs a float16 input"
    rows = reduced_rows(self, dim)
    return why.reduced_dim(self, dim) or why.rows(rows) or rows


def backward_plan_or_why(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype
                         ) -> tuple[Rows, Rows] | str:
    found = why.device(grad_output, output) or why.dtype(output) or why.same(output, grad_output, "grad_output")
    if found:
        return found
    # No conversion, or the backward of a half_to_float forward (fp32 grads, fp16 input).
    if input_dtype != output.dtype and not (output.dtype == torch.float32 and input_dtype == torch.float16):
        return f"input_dtype {why.name(input_dtype)} differs from the output's {why.name(output.dtype)}"
    rows, grad_rows = reduced_rows(output, dim), reduced_rows(grad_output, dim)
    return why.reduced_dim(output, dim) or why.rows(rows) or why.rows(grad_rows, "grad rows") or (rows, grad_rows)


def _forward_impl(log: bool) -> Callable[..., Tensor]:
    def impl(self: Tensor, dim: int, half_to_float: bool, plan: Rows | None = None) -> Tensor:
        rows = plan or reduced_rows(self, dim)
        out_dtype = torch.float32 if half_to_float else self.dtype
        flags = (("log",) if log else ()) + vector_flags(rows, self)
        run = launcher("softmax_forward", self.dtype, out_dtype, rows.n_cols, self, *flags)
        y = torch.empty((rows.n_rows, rows.n_cols), device=self.device, dtype=out_dtype)
        run(matrix(self, rows), y)
        return y.view(self.shape)

    impl.__name__ = impl.__qualname__ = f"{'log_' if log else ''}softmax_impl"
    return impl


def _backward_impl(log: bool) -> Callable[..., Tensor]:
    def impl(grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype,
             plan: tuple[Rows, Rows] | None = None) -> Tensor:
        rows, grad_rows = plan or (reduced_rows(output, dim), reduced_rows(grad_output, dim))
        run = launcher("softmax_backward", output.dtype, input_dtype, rows.n_cols, output, *(("log",) if log else ()))
        dx = torch.empty((rows.n_rows, rows.n_cols), device=output.device, dtype=input_dtype)
        run(matrix(grad_output, grad_rows), matrix(output, rows), dx)
        return dx.view(output.shape)

    impl.__name__ = impl.__qualname__ = f"{'log_' if log else ''}softmax_backward_impl"
    return impl


softmax_impl, log_softmax_impl = _forward_impl(False), _forward_impl(True)
softmax_backward_impl, log_softmax_backward_impl = _backward_impl(False), _backward_impl(True)

FAMILY = Family(DSL_NAME, "softmax", [
    Op("_softmax", forward_plan_or_why, softmax_impl, ("self", "dim", "half_to_float", "self.get_device()"),
       public_name="softmax", bench_rows=(bench_cases.SOFTMAX,), verify=SOFTMAX),
    Op("_log_softmax", forward_plan_or_why, log_softmax_impl, ("self", "dim", "half_to_float", "self.get_device()"),
       public_name="log_softmax", bench_rows=(bench_cases.LOG_SOFTMAX,), verify=LOG_SOFTMAX),
    Op("_softmax_backward_data", backward_plan_or_why, softmax_backward_impl,
       ("grad_output", "output", "dim", "input_dtype", "output.get_device()"), public_name="softmax", backward=True,
       bench=("softmax",)),
    Op("_log_softmax_backward_data", backward_plan_or_why, log_softmax_backward_impl,
       ("grad_output", "output", "dim", "input_dtype", "output.get_device()"), public_name="log_softmax",
       backward=True, bench=("log_softmax",)),
], kernels=KERNELS)


def precompile_specializations() -> list[tuple[str, str, object]]:
    """Every dtype and size class, softmax and log-softmax, plus the fp16 -> fp32 (half_to_float) pair."""
    from ..specialization import Specialization

    pairs = [(d, d) for d in DTYPE_NAMES.values()] + [("float16", "float32")]
    out = []
    for dtype, wide in pairs:
        for cls, _, _ in SIZE_CLASSES:
            for log, (fwd, bwd) in ((False, ("_softmax", "_softmax_backward_data")),
                                    (True, ("_log_softmax", "_log_softmax_backward_data"))):
                flags = frozenset({"log"}) if log else frozenset()
                for vec in (frozenset(), frozenset({"vec"})):
                    out.append((fwd, cls, Specialization("softmax_forward", dtype, wide, threads_of(cls), flags | vec)))
                # the backward reads the forward's output (``wide``) and writes the input dtype
                out.append((bwd, cls, Specialization("softmax_backward", wide, dtype, threads_of(cls), flags)))
    return out
