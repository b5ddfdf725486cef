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

from collections.abc import Callable
from typing import NamedTuple

import torch

from python_native_dsls import bench_cases
from python_native_dsls.family import Family, Op
from python_native_dsls.verify_cases import REDUCTIONS

from ..target import DSL_NAME
from . import why
from ._rows import DTYPE_NAMES, KERNELS, SIZE_CLASSES, Rows, launcher, matrix, reduced_rows, threads_of, vector_flags

Tensor = torch.Tensor

# aten symbol -> the kernel's reduction; the family is generated from it (sum and mean take ``dtype=``).
KINDS = {"sum.dim_IntList": "sum", "mean.dim": "mean", "amax": "max", "amin": "min"}
_DTYPED = frozenset({"sum.dim_IntList", "mean.dim"})


class RowReduce(NamedTuple):
    """A reduction of each row: the rows, and the result's shape."""

    rows: Rows
    out_shape: tuple[int, ...]


def plan_or_why(self: Tensor, dim: list[int] | None, keepdim: bool = False,
                dtype: torch.dtype | None = None) -> RowReduce | str:
    """The plan where the kernel reduces ``self`` over its one dim ``dim`` (the last of size > 1), else why not."""
    if dim is None or len(dim) != 1:
        return f"dim={None if dim is None else list(dim)}: the kernels reduce over exactly one dim"
    found = why.device(self) or why.dtype(self)
    if found:
        return found
    if dtype is not None and dtype != self.dtype:
        return f"dtype={why.name(dtype)} (the kernels return the input's {why.name(self.dtype)})"
    d = dim[0]
    rows = reduced_rows(self, d)
    found = why.reduced_dim(self, d) or why.rows(rows)
    if found:
        return found
    d %= self.ndim
    shape = tuple(self.shape)
    return RowReduce(rows, shape[:d] + ((1,) if keepdim else ()) + shape[d + 1:])


def _impl(op: str) -> Callable[..., Tensor]:
    kind = KINDS[op]

    def impl(self: Tensor, dim: list[int], keepdim: bool = False, dtype: torch.dtype | None = None,
             plan: RowReduce | None = None) -> Tensor:
        if plan is None:  # called without its cond: the dim's own rows
            d = dim[0] % self.ndim
            shape = tuple(self.shape)
            plan = RowReduce(reduced_rows(self, d), shape[:d] + ((1,) if keepdim else ()) + shape[d + 1:])
        rows = plan.rows
        run = launcher("row_reduce", self.dtype, self.dtype, rows.n_cols, self, kind, *vector_flags(rows, self))
        y = torch.empty(rows.n_rows, device=self.device, dtype=self.dtype)
        run(matrix(self, rows), y)
        return y.view(plan.out_shape)

    impl.__name__ = impl.__qualname__ = f"{op.partition('.')[0]}_impl"
    return impl


def _op(op: str) -> Op:
    key = ("self", "dim if dim is None else tuple(dim)", "keepdim",
                            *(("dtype",) if op in _DTYPED else ()), "self.get_device()")
    return Op(op, plan_or_why, _impl(op), key, measured=False, options={"derive_forms": ("out",)},
              bench_rows=(bench_cases.REDUCTIONS[op.partition(".")[0]],), verify=REDUCTIONS[op])


FAMILY = Family(DSL_NAME, "reductions", [_op(op) for op in KINDS], kernels=KERNELS)


def precompile_specializations() -> list[tuple[str, str, object]]:
    """Every dtype, size class and reduction, plain and vectorized."""
    from ..specialization import Specialization

    return [
        (op, cls, Specialization("row_reduce", dtype, dtype, threads_of(cls), frozenset({kind, *vec})))
        for op, kind in KINDS.items()
        for dtype in DTYPE_NAMES.values()
        for cls, _, _ in SIZE_CLASSES
        for vec in ((), ("vec",))
    ]
