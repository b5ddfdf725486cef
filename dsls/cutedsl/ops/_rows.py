"""The limits of the CuTe DSL row kernels, and the glue that launches them.

The kernels read ``n_rows x n_cols`` views with unit column stride and any row stride, so
contiguous tensors and row slices of wider buffers run without a copy. Loops stride over each row,
so there is no upper bound on the row length beyond 32-bit column indices; the grid has one CTA
per row, so the row count is bounded by the grid's x limit (``why.rows`` checks both). Programs
are compiled, or read from the kernel cache, through the one guarded loader of the compiler.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from python_native_dsls.constants import sm_count
from python_native_dsls.family import kernel_loader
from python_native_dsls.layout import Rows, as_rows, reduced_rows, stat_shape

from ..specialization import Specialization
from ..target import DSL_NAME

__all__ = ["Rows", "as_rows", "reduced_rows", "stat_shape"]

# The one kernel module every family's impls reach (``FAMILY.kernels`` of each is this loader).
KERNELS = "compiler"
compiler = kernel_loader(DSL_NAME, f"python_native_dsls.cutedsl.kernels.{KERNELS}")

MAX_ROWS = 2**31 - 1  # gridDim.x
MAX_COLS = 2**31 - 1  # column indices are int32

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

# Size classes by row length: (name, longest row, threads per CTA). Short rows waste fewer idle
# threads with a small CTA; long rows want more loads in flight.
SIZE_CLASSES = (("short", 1024, 128), ("medium", 8192, 256), ("long", MAX_COLS, 512))


def size_class(n_cols: int) -> tuple[str, int]:
    """``(name, threads)`` of the class a row length falls in."""
    for name, longest, threads in SIZE_CLASSES:
        if n_cols <= longest:
            return name, threads
    raise ValueError(f"row length {n_cols} exceeds the CuTe DSL kernels' limit of {MAX_COLS}")


def threads_of(name: str) -> int:
    for cls, _, threads in SIZE_CLASSES:
        if cls == name:
            return threads
    raise ValueError(f"unknown size class {name!r}; expected one of {[c for c, _, _ in SIZE_CLASSES]}")


def matrix(t: torch.Tensor, r: Rows) -> torch.Tensor:
    """``t`` as the ``n_rows x n_cols`` view the kernels take (no copy)."""
    return t.as_strided((r.n_rows, r.n_cols), (r.row_stride, 1), t.storage_offset())


@functools.cache
def _placeholder(device: torch.device, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    return torch.zeros((1,) * ndim, device=device, dtype=dtype)


def placeholder(like: torch.Tensor, dtype: torch.dtype, ndim: int = 1) -> torch.Tensor:
    """A tensor standing in for an absent argument the compiled specialization never reads."""
    return _placeholder(like.device, dtype, ndim)


@functools.cache
def _arch(index: int | None) -> str:
    return compiler().device_arch(index)


def arch(t: torch.Tensor) -> str:
    """The target of ``t``'s device (``$CUTE_DSL_ARCH`` wins; None is the current device)."""
    return _arch(t.device.index)


def backward_ctas(t: torch.Tensor, n_rows: int) -> int:
    """CTAs of a norm backward: a few per SM, each owning one fp32 row of parameter-gradient partials."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return max(1, min(n_rows, 2 * sm_count(index)))


def vector_flags(r: Rows, *tensors: torch.Tensor | None) -> tuple[str, ...]:
    """``("vec",)`` when 16-byte accesses fit: rows and row strides a multiple of 16 bytes, every
    tensor read 16-byte aligned (outputs are fresh allocations, which are)."""
    t0 = next(t for t in tensors if t is not None)
    per_access = 16 // t0.element_size()
    if r.n_cols % per_access or (r.n_rows > 1 and r.row_stride % per_access):
        return ()
    if any(t is not None and t.data_ptr() % 16 for t in tensors):
        return ()
    return ("vec",)


# (kernel, dtypes, threads, flags, device index) -> loaded program: one dict lookup per call.
_launchers: dict[tuple, Any] = {}


def current_device() -> int:
    """The index of the current CUDA device (what a launch would target without a guard)."""
    return torch.cuda.current_device()


def _on_device(index: int, fn: Any) -> Any:
    """``fn`` run with CUDA device ``index`` current: a program loads into, and launches on, the
    current device's context and stream, which need not be its tensors' device. The guard is
    entered only where the devices differ (one C call otherwise)."""
    def on_device(*args: Any) -> Any:
        if current_device() == index:
            return fn(*args)
        with torch.cuda.device(index):
            return fn(*args)

    return on_device


def launcher(kernel: str, dtype: torch.dtype, out_dtype: torch.dtype, n_cols: int, like: torch.Tensor, *flags: str):
    """The loaded program for this call's specialization (compiled or read from disk on first use), run on
    ``like``'s device."""
    threads = size_class(n_cols)[1]
    index = like.device.index
    key = (kernel, dtype, out_dtype, threads, flags, index)
    fn = _launchers.get(key)
    if fn is None:
        v = Specialization(kernel, DTYPE_NAMES[dtype], DTYPE_NAMES[out_dtype], threads, frozenset(flags))
        if index is None:  # not a CUDA tensor: nothing to guard (TVM-FFI names the device it expected)
            fn = _launchers[key] = compiler().function(v, arch(like))
        else:
            fn = _launchers[key] = _on_device(index, _on_device(index, lambda: compiler().function(v, arch(like)))())
    return fn
