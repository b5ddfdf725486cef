"""``sum``, ``mean``, ``amax`` and ``amin`` over the last dim on the CuTe DSL row kernel (CUDA only).

Accepted: fp32, fp16 and bf16 inputs reduced over one dim that is the last one not of size 1,
with unit stride, the other dims collapsing to one strided row axis; ``keepdim`` either way;
``dtype=`` absent or the input's own. Sums accumulate in fp32; amax/amin return NaN for rows
holding one, as aten does. Declined (aten or the Triton override runs): other dims, several or
all dims, other dtypes and ``dtype=`` casts, empty and zero-dim tensors.

Like every new op, these wait for a GPU's timings: they install where a calibration table has
rows for them (``OverrideSpec.measured``), and the CuTe DSL installs disabled until opted in.
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

KINDS = {"sum.dim_IntList": "sum", "mean.dim": "mean", "amax": "max", "amin": "min"}


def _dim(self: Tensor, dim: list[int] | None) -> int | None:
    """The one reduced dim when the kernel takes it: the input's last non-trivial, unit-stride dim."""
    if dim is None or len(dim) != 1 or not (on_cuda(self) and float_dtype(self)):
        return None
    d = dim[0]
    return d if unit_rows(reduced_rows(self, d)) else None


def sum_cond(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> bool:
    return (dtype is None or dtype == self.dtype) and _dim(self, dim) is not None


def minmax_cond(self: Tensor, dim: list[int] = (), keepdim: bool = False) -> bool:
    return _dim(self, dim) is not None


def _reduce(kind: str, self: Tensor, dim: list[int], keepdim: bool) -> Tensor:
    d = dim[0] % self.ndim
    rows = reduced_rows(self, d)
    run = launcher("row_reduce", self.dtype, self.dtype, rows.n_cols, self, kind, *vector_flags(rows, self))
    y = torch.empty(rows.n_rows, device=self.device, dtype=self.dtype)
    run(matrix(self, rows), y)
    shape = list(self.shape)
    if keepdim:
        shape[d] = 1
    else:
        del shape[d]
    return y.view(shape)


def sum_impl(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    return _reduce("sum", self, dim, keepdim)


def mean_impl(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    return _reduce("mean", self, dim, keepdim)


def amax_impl(self: Tensor, dim: list[int] = (), keepdim: bool = False) -> Tensor:
    return _reduce("max", self, dim, keepdim)


def amin_impl(self: Tensor, dim: list[int] = (), keepdim: bool = False) -> Tensor:
    return _reduce("min", self, dim, keepdim)


OVERRIDES = [
    OverrideSpec(op, cond, impl, {"derive_variants": ("out",)}, measured=False)
    for op, cond, impl in (
        ("sum.dim_IntList", sum_cond, sum_impl),
        ("mean.dim", sum_cond, mean_impl),
        ("amax", minmax_cond, amax_impl),
        ("amin", minmax_cond, amin_impl),
    )
]


def precompile_variants() -> list[tuple[str, str, object]]:
    """Every dtype, size class and reduction, plain and vectorized."""
    from ..variant import Variant

    return [
        (op, cls, Variant("row_reduce", dtype, dtype, threads_of(cls), frozenset({kind, *vec})))
        for op, kind in KINDS.items()
        for dtype in DTYPE_NAMES.values()
        for cls, _, _ in SIZE_CLASSES
        for vec in ((), ("vec",))
    ]
