"""Reductions over one dim on the Triton kernels: ``sum``, ``mean``, ``prod``, ``amax``, ``amin``,
``argmax``, ``argmin``, ``max.dim`` and ``min.dim`` (and their ``out=`` variants).

Accepted: one dim of a non-empty tensor of at least one dim, any position, whose dims before and
after it each collapse to one evenly strided axis (contiguous tensors, row slices, transposes of
two dims, expanded inputs), ``keepdim`` either way. Dtypes: fp16, bf16, fp32, fp64 and the signed
integers and uint8 (``sum``/``prod`` also bool); results have aten's dtypes (integer and bool sums
and products are int64, arg reductions int64), half-precision inputs accumulate in fp32.
``dtype=`` is taken where casting each element first and accumulating gives aten's value:
widening floats, narrowing fp32 to fp16/bf16 or fp64 to fp32, integers to fp32/fp64 or to another
integer type (wrapping as aten does).

Declined (aten runs, and raises its own errors): several dims or all of them (``dim=None``,
``[]``, lists of two or more), zero-dim and empty tensors (aten's empty-dim errors and empty
results), complex, bool for the max/min family, uint16/32/64, fp8, ``mean`` of integers without a
float ``dtype=``, float-to-integer ``dtype=`` and the casts listed above as not exact, layouts
whose other dims do not collapse, and sizes past the kernels' int32 offsets or grid.

The overrides are marked unmeasured: on a GPU they install only where a calibration table has
timed them (``OverrideSpec.measured``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from python_native_dsls import bench_cases
from python_native_dsls.family import Family, Op
from python_native_dsls.verify_cases import REDUCTIONS

from ..plans.reduce import MAX, MEAN, MIN, PROD, SUM, ReducePlan, accumulator, reduce_plan, reduce_view
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
_HALF = frozenset({torch.float16, torch.bfloat16})
_COMPARABLE = why.names(FLOATS | INTS)
_SUMMABLE = why.names(FLOATS | INTS | {torch.bool})

# op -> (aten symbol, kernel code, returns values, returns the index, dim is an ``int[1]?`` list,
# takes ``dtype=``, bench rows). The family's ops are generated from this table.
OPS: dict[str, tuple[str, int, bool, bool, bool, bool, tuple[str, ...]]] = {
    "sum": ("sum.dim_IntList", SUM, True, False, True, True, ("sum", "sum_dim0")),
    "mean": ("mean.dim", MEAN, True, False, True, True, ("mean",)),
    "prod": ("prod.dim_int", PROD, True, False, False, True, ("prod",)),
    "amax": ("amax", MAX, True, False, True, False, ("amax",)),
    "amin": ("amin", MIN, True, False, True, False, ("amin",)),
    "argmax": ("argmax", MAX, False, True, False, False, ("argmax",)),
    "argmin": ("argmin", MIN, False, True, False, False, ("argmin",)),
    "max": ("max.dim", MAX, True, True, False, False, ("max_dim",)),
    "min": ("min.dim", MIN, True, True, False, False, ("min_dim",)),
}


def sum_dtypes(src: torch.dtype, dtype: torch.dtype | None, mean: bool) -> tuple[torch.dtype, torch.dtype | None] | str:
    """``(result dtype, cast applied to each element first)`` of a sum or mean the kernels compute
    exactly as aten does, else why not (a str: the traced reason of the decline)."""
    integral = src in INTS or src == torch.bool
    if not (integral or src in FLOATS):
        return f"dtype {why.name(src)} (the kernels sum {_SUMMABLE})"
    if dtype is None or dtype == src:
        if src in FLOATS:
            return src, None
        if mean:
            return f"mean of {why.name(src)} without a float dtype="
        if dtype == torch.bool:
            return "dtype=bool (the kernels sum bools into int64)"
        return torch.int64 if dtype is None else src, None
    if dtype in INTS:  # integers only from integers: wrapping in int64 then truncating is aten's wrap
        if not integral:
            return f"dtype={why.name(dtype)} from {why.name(src)}: the kernels cast to integers only from integers"
        return f"mean to the integer dtype={why.name(dtype)}" if mean else (dtype, None)
    if dtype not in FLOATS:
        return f"dtype={why.name(dtype)} (the kernels take {_SUMMABLE})"
    if integral:  # one rounding from an integer: only where no fp32 intermediate rounds first
        if dtype in (torch.float32, torch.float64):
            return dtype, dtype
        return f"dtype={why.name(dtype)} from {why.name(src)}: not rounded as aten rounds"
    if dtype in _HALF and (src in _HALF or src == torch.float32):
        return dtype, dtype  # one rounding of an fp32-exact value
    if src == torch.float64 and dtype == torch.float32:
        return dtype, dtype
    if accumulator(dtype).itemsize >= src.itemsize and dtype.itemsize > src.itemsize:
        return dtype, None  # widening: the accumulator reads every element exactly
    return f"dtype={why.name(dtype)} from {why.name(src)}: not rounded as aten rounds"


def plan_or_why(op: str, x: Tensor, dim: Any, keepdim: bool = False, dtype: torch.dtype | None = None
                ) -> ReducePlan | str:
    """The launch plan of a call the kernels take, else why not (metadata only)."""
    if dim is None or isinstance(dim, (list, tuple)):  # ``int[1]?`` or optional dims: exactly one
        if dim is None or len(dim) != 1:
            return f"dim={None if dim is None else list(dim)}: the kernels reduce over exactly one dim"
        dim = dim[0]
    found = why.device(x)
    if found:
        return found
    if x.layout != torch.strided:
        return f"layout {str(x.layout).removeprefix('torch.')} (the kernels take strided tensors)"
    if x.ndim == 0:
        return "a 0-d input"
    if not -x.ndim <= dim < x.ndim:
        return f"dim {dim} is out of range for a {x.ndim}-d input"
    if x.numel() == 0:
        return "empty input"
    _, code, values, index, _, _, _ = OPS[op]
    if code in (SUM, MEAN, PROD):
        dtypes = sum_dtypes(x.dtype, dtype, code == MEAN)
        if dtypes.__class__ is str:
            return dtypes
        out_dtype, cast = dtypes
    elif x.dtype in FLOATS or x.dtype in INTS:
        out_dtype, cast = x.dtype, None
    else:
        return f"dtype {why.name(x.dtype)} (the {op} kernels take {_COMPARABLE})"
    dim %= x.ndim
    view = reduce_view(x, dim)
    if view is None:
        return f"layout: the dims before dim {dim} or those after it do not collapse to one strided axis"
    shape = tuple(x.shape)
    out_shape = shape[:dim] + ((1,) if keepdim else ()) + shape[dim + 1 :]
    return reduce_plan(code, view, out_shape, out_dtype if values else None, index, cast, accumulator(out_dtype))


def _plan_or_why(op: str) -> Callable[..., ReducePlan | str]:
    def plan(self: Tensor, dim: Any, keepdim: bool = False, dtype: torch.dtype | None = None) -> ReducePlan | str:
        return plan_or_why(op, self, dim, keepdim, dtype)

    plan.__name__ = plan.__qualname__ = f"{op}_plan_or_why"
    return plan


def _impl(op: str) -> Callable[..., Any]:
    """The impl of ``op``: its values, its indices, or both (``max.dim``, ``min.dim``)."""
    values, index = OPS[op][2:4]
    pick = slice(None) if values and index else (1 if index else 0)

    def impl(self: Tensor, dim: Any, keepdim: bool = False, dtype: torch.dtype | None = None,
             plan: ReducePlan | None = None) -> Any:
        if plan is None:  # called without its cond: plan here, and say why where the kernels cannot
            plan = plan_or_why(op, self, dim, keepdim, dtype)
            if plan.__class__ is str:
                raise ValueError(f"{op}: the Triton reduction kernels do not take this call ({plan}); call "
                                 f"torch.{op} to let aten run it")
        return FAMILY.kernels().run(self, plan)[pick]

    impl.__name__ = impl.__qualname__ = f"{op}_impl"
    return impl


def _op(op: str) -> Op:
    symbol, _, _, _, listed, dtyped, bench = OPS[op]
    key = ("self", "dim if dim is None else tuple(dim)" if listed else "dim", "keepdim", *(("dtype",) if dtyped else ()))
    return Op(symbol, _plan_or_why(op), _impl(op), key, measured=False, options={"derive_forms": ("out",)},
              bench_rows=tuple(bench_cases.REDUCTIONS[row] for row in bench), verify=REDUCTIONS[symbol])


FAMILY = Family(DSL_NAME, "reductions", [_op(op) for op in OPS], kernels="reductions")
