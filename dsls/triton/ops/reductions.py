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

import functools
from types import ModuleType
from typing import Any

import torch

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.spec import OverrideSpec

from ..plans.reduce import MAX, MEAN, MIN, PROD, SUM, ReducePlan, accumulator, reduce_plan, reduce_view
from . import why

Tensor = torch.Tensor

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
INTS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
_HALF = frozenset({torch.float16, torch.bfloat16})
_COMPARABLE = why.names(FLOATS | INTS)
_SUMMABLE = why.names(FLOATS | INTS | {torch.bool})

# op -> (code, returns values, returns the index)
OPS = {
    "sum": (SUM, True, False), "mean": (MEAN, True, False), "prod": (PROD, True, False),
    "amax": (MAX, True, False), "amin": (MIN, True, False), "argmax": (MAX, False, True),
    "argmin": (MIN, False, True), "max": (MAX, True, True), "min": (MIN, True, True),
}


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import reductions

    return reductions


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


# The conds' checks, once: ``_build`` (behind the plan cache) declines exactly where this gives a
# reason, and the traced explanations (``_why``) report that reason.
def _plan_or_why(op: str, x: Tensor, dim: int, keepdim: bool, dtype: torch.dtype | None) -> ReducePlan | str:
    """The launch plan of a call the kernels take, else why not (metadata only)."""
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
    code, values, index = OPS[op]
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


def _build(op: str, x: Tensor, dim: int, keepdim: bool, dtype: torch.dtype | None) -> ReducePlan | None:
    """The launch plan of a call the kernels take, else None."""
    plan = _plan_or_why(op, x, dim, keepdim, dtype)
    return None if plan.__class__ is str else plan


_PLANS: SpecializationCache[ReducePlan | None] = SpecializationCache(_build, 4096)
_lookup = _PLANS.lookup


def plan_for(op: str, x: Tensor, dim: int, keepdim: bool, dtype: torch.dtype | None = None) -> ReducePlan | None:
    """The plan, cached per layout for real tensors (FakeTensors are planned directly)."""
    if x.__class__ is not Tensor:
        return _build(op, x, dim, keepdim, dtype)
    key = (op, x.size(), x.stride(), x.dtype, x.is_cuda, x.is_cpu, dim, keepdim, dtype)
    plan = _lookup(key, MISSING)
    return _PLANS.get(key, op, x, dim, keepdim, dtype) if plan is MISSING else plan


def _one(dim: list[int] | None) -> int | None:
    """The dim of a one-dim list (``int[1]?`` arguments), else None."""
    return dim[0] if dim is not None and len(dim) == 1 else None


def _run(op: str, x: Tensor, dim: Any, keepdim: bool, dtype: torch.dtype | None,
         plan: ReducePlan | None) -> tuple[Tensor | None, Tensor | None]:
    if plan is None:
        d = _one(dim) if isinstance(dim, (list, tuple)) else dim
        plan = plan_for(op, x, d, keepdim, dtype) if d is not None else None
        if plan is None:
            raise ValueError(
                f"{op}: the Triton reduction kernels do not take this call (dim={dim!r}, dtype={dtype}, input "
                f"{x.dtype} of shape {tuple(x.shape)} and strides {x.stride()}); call torch.{op} to let aten run it"
            )
    return _kernels().run(x, plan)


# Conds return the plan (None: declined); the router hands it to the impl as ``plan``.
def sum_cond(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None):
    d = _one(dim)
    return None if d is None else plan_for("sum", self, d, keepdim, dtype)


def mean_cond(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None):
    d = _one(dim)
    return None if d is None else plan_for("mean", self, d, keepdim, dtype)


def prod_cond(self: Tensor, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None):
    return plan_for("prod", self, dim, keepdim, dtype)


def amax_cond(self: Tensor, dim: list[int] = (), keepdim: bool = False):
    d = _one(dim)
    return None if d is None else plan_for("amax", self, d, keepdim)


def amin_cond(self: Tensor, dim: list[int] = (), keepdim: bool = False):
    d = _one(dim)
    return None if d is None else plan_for("amin", self, d, keepdim)


def argmax_cond(self: Tensor, dim: int | None = None, keepdim: bool = False):
    return None if dim is None else plan_for("argmax", self, dim, keepdim)


def argmin_cond(self: Tensor, dim: int | None = None, keepdim: bool = False):
    return None if dim is None else plan_for("argmin", self, dim, keepdim)


def max_cond(self: Tensor, dim: int, keepdim: bool = False):
    return plan_for("max", self, dim, keepdim)


def min_cond(self: Tensor, dim: int, keepdim: bool = False):
    return plan_for("min", self, dim, keepdim)


def _why(op: str, x: Tensor, dim: Any, keepdim: bool, dtype: torch.dtype | None = None) -> str | None:
    """Why the cond of ``op`` declined (asked by traced calls only): the plan builder's own reason."""
    if dim is None or isinstance(dim, (list, tuple)):  # ``int[1]?`` or optional dims: exactly one
        one = _one(dim)
        if one is None:
            return f"dim={None if dim is None else list(dim)}: the kernels reduce over exactly one dim"
        dim = one
    found = _plan_or_why(op, x, dim, keepdim, dtype)
    return found if found.__class__ is str else None


def sum_explain(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> str | None:
    return _why("sum", self, dim, keepdim, dtype)


def mean_explain(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> str | None:
    return _why("mean", self, dim, keepdim, dtype)


def prod_explain(self: Tensor, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> str | None:
    return _why("prod", self, dim, keepdim, dtype)


def amax_explain(self: Tensor, dim: list[int] = (), keepdim: bool = False) -> str | None:
    return _why("amax", self, dim, keepdim)


def amin_explain(self: Tensor, dim: list[int] = (), keepdim: bool = False) -> str | None:
    return _why("amin", self, dim, keepdim)


def argmax_explain(self: Tensor, dim: int | None = None, keepdim: bool = False) -> str | None:
    return _why("argmax", self, dim, keepdim)


def argmin_explain(self: Tensor, dim: int | None = None, keepdim: bool = False) -> str | None:
    return _why("argmin", self, dim, keepdim)


def max_explain(self: Tensor, dim: int, keepdim: bool = False) -> str | None:
    return _why("max", self, dim, keepdim)


def min_explain(self: Tensor, dim: int, keepdim: bool = False) -> str | None:
    return _why("min", self, dim, keepdim)


def sum_impl(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None,
             plan: ReducePlan | None = None) -> Tensor:
    return _run("sum", self, dim, keepdim, dtype, plan)[0]


def mean_impl(self: Tensor, dim: list[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None,
              plan: ReducePlan | None = None) -> Tensor:
    return _run("mean", self, dim, keepdim, dtype, plan)[0]


def prod_impl(self: Tensor, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None,
              plan: ReducePlan | None = None) -> Tensor:
    return _run("prod", self, dim, keepdim, dtype, plan)[0]


def amax_impl(self: Tensor, dim: list[int] = (), keepdim: bool = False, plan: ReducePlan | None = None) -> Tensor:
    return _run("amax", self, dim, keepdim, None, plan)[0]


def amin_impl(self: Tensor, dim: list[int] = (), keepdim: bool = False, plan: ReducePlan | None = None) -> Tensor:
    return _run("amin", self, dim, keepdim, None, plan)[0]


def argmax_impl(self: Tensor, dim: int | None = None, keepdim: bool = False, plan: ReducePlan | None = None) -> Tensor:
    return _run("argmax", self, dim, keepdim, None, plan)[1]


def argmin_impl(self: Tensor, dim: int | None = None, keepdim: bool = False, plan: ReducePlan | None = None) -> Tensor:
    return _run("argmin", self, dim, keepdim, None, plan)[1]


def max_impl(self: Tensor, dim: int, keepdim: bool = False, plan: ReducePlan | None = None) -> tuple[Tensor, Tensor]:
    return _run("max", self, dim, keepdim, None, plan)


def min_impl(self: Tensor, dim: int, keepdim: bool = False, plan: ReducePlan | None = None) -> tuple[Tensor, Tensor]:
    return _run("min", self, dim, keepdim, None, plan)


def _spec(op: str, cond, impl, explain) -> OverrideSpec:
    return OverrideSpec.planned(op, cond, impl, measured=False, derive_variants=("out",), explain=explain)


OVERRIDES = [
    _spec("sum.dim_IntList", sum_cond, sum_impl, sum_explain),
    _spec("mean.dim", mean_cond, mean_impl, mean_explain),
    _spec("prod.dim_int", prod_cond, prod_impl, prod_explain),
    _spec("amax", amax_cond, amax_impl, amax_explain),
    _spec("amin", amin_cond, amin_impl, amin_explain),
    _spec("argmax", argmax_cond, argmax_impl, argmax_explain),
    _spec("argmin", argmin_cond, argmin_impl, argmin_explain),
    _spec("max.dim", max_cond, max_impl, max_explain),
    _spec("min.dim", min_cond, min_impl, min_explain),
]
