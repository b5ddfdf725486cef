"""``scatter_add`` and ``index_add`` (functional, in-place; ``out=`` derived) on the atomic scatter-add kernel.

Accepted: float32, float16, bfloat16, float64, int32 and int64 on the backend's device, self,
index and source of aten's shapes for the op (``scatter_add``: int64 index of self's rank, no
larger than source, nor than self outside ``dim``; ``index_add``: 1-D int32/int64 index, source
shaped as self but along ``dim``), whose dims before and after ``dim`` each collapse to one
strided axis over the iteration space. In place: self dense (no internal overlap) and apart from
index and source in memory. ``index_add``'s alpha: any int or float for float types (float64:
one that float32 holds exactly), an int within the dtype for integer types.

Declined: other dtypes, 0-dim or empty inputs, mismatched dtypes or shapes (aten raises its own
errors), and float types under ``torch.use_deterministic_algorithms(True)``: atomics add in no
fixed order, so aten (whose deterministic path this respects) runs then. Integer sums are exact in
any order and stay on the kernel.

Half types add in a float32 copy of self, rounded once: at least as accurate as aten, whose kernels
round every addition. An index out of range raises aten's error (CUDA: an asynchronous device
assert, as aten's); in-range elements may have been added to an in-place self by then.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import torch

from python_native_dsls.family import Family, Op
from python_native_dsls.proving import FORWARD, BenchRow, Driver, LlmCase, Sample, Tensors, rand

from ..plans.layout import dense_like
from ..plans.scatter import DTYPES, Axes, ScatterPlan, axes, contiguous_strides, scatter_plan, span
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
_DTYPES = why.names(DTYPES)


def _alpha_or_why(alpha: Any, dtype: torch.dtype) -> Any:
    """``alpha`` as the kernel scales by it (None: 1, no scaling), or why not (a str)."""
    cls = alpha.__class__
    if dtype.is_floating_point:
        if cls is not int and cls is not float:
            return f"alpha of type {cls.__name__} (the kernel takes an int or float alpha)"
        if alpha == 1:
            return None
        if dtype == torch.float64:  # the kernel's float argument is a float32
            try:
                if struct.unpack("f", struct.pack("f", alpha))[0] != alpha:
                    return f"alpha = {alpha!r} is not exact in float32 (the kernel scales float64 by a float32)"
            except OverflowError:
                return f"alpha = {alpha!r} overflows float32 (the kernel scales float64 by a float32)"
        return float(alpha)
    if cls is not int:
        return f"alpha of type {cls.__name__} for {why.name(dtype)} (integer types take an int alpha)"
    bits = 31 if dtype == torch.int32 else 63
    if not -(2**bits) <= alpha < 2**bits:
        return f"alpha = {alpha} is outside {why.name(dtype)}"
    return None if alpha == 1 else alpha


def _finish(self: Tensor, dim: int, space: tuple[int, ...], index: Axes | None, source: Tensor,
            inplace: bool, alpha: Any, index_t: Tensor) -> ScatterPlan | str:
    """The plan over ``space`` once the op's own checks passed, else why not."""
    acc = torch.float32 if self.dtype in (torch.float16, torch.bfloat16) else self.dtype
    direct = inplace and acc == self.dtype  # adds straight into self
    if direct and not dense_like(self):
        return "layout: self is not dense (in place, the kernel adds into it directly)"
    out = axes(space, self.stride() if direct else contiguous_strides(self.shape), dim)
    src = axes(space, source.stride(), dim)
    for what, found in (("index", index), ("self", out), ("source", src)):
        if found is None:
            return f"layout: {what}'s dims before dim {dim} or those after it do not collapse to one strided axis"
    spans = tuple(span(t.shape, t.stride()) * t.element_size() for t in (self, index_t, source))
    return scatter_plan(space, dim, self.shape[dim], index, src, out, self.dtype, alpha, spans)


def _common(self: Any, dim: int, index: Any, source: Any) -> int | str:
    """``dim`` wrapped where the three are tensors the kernel could take; else why not."""
    for what, t in (("index", index), ("source", source)):
        if not isinstance(t, Tensor):
            return f"{what} is a {t.__class__.__name__} (the kernel takes a tensor)"
    found = why.device(self, index, source)
    if found:
        return found
    n = self.ndim
    if self.dtype not in DTYPES:
        return f"dtype {why.name(self.dtype)} (the kernel takes {_DTYPES})"
    if source.dtype != self.dtype:
        return f"source dtype {why.name(source.dtype)} differs from self's {why.name(self.dtype)}"
    if n == 0:
        return "a 0-d self"
    if source.ndim != n:
        return f"a {source.ndim}-d source for a {n}-d self"
    if not -n <= dim < n:
        return f"dim {dim} is out of range for a {n}-d self"
    return dim % n


def _scatter_plan_or_why(self: Tensor, dim: int, index: Tensor, src: Tensor, inplace: bool) -> ScatterPlan | str:
    dim = _common(self, dim, index, src)
    if dim.__class__ is str:
        return dim
    if index.dtype != torch.int64:
        return f"index dtype {why.name(index.dtype)} (scatter_add takes int64)"
    if index.ndim != self.ndim:
        return f"a {index.ndim}-d index for a {self.ndim}-d self"
    space = tuple(index.shape)
    for d, size in enumerate(space):
        if size > src.shape[d]:
            return f"index size {size} exceeds the source's {src.shape[d]} at dim {d}"
        if d != dim and size > self.shape[d]:
            return f"index size {size} exceeds self's {self.shape[d]} at dim {d}"
    return _finish(self, dim, space, axes(space, index.stride(), dim), src, inplace, None, index)


def _index_plan_or_why(self: Tensor, dim: int, index: Tensor, source: Tensor, inplace: bool,
                       alpha: Any) -> ScatterPlan | str:
    dim = _common(self, dim, index, source)
    if dim.__class__ is str:
        return dim
    if index.dtype not in (torch.int32, torch.int64):
        return f"index dtype {why.name(index.dtype)} (the kernel takes int32, int64)"
    if index.ndim != 1:
        return f"a {index.ndim}-d index (index_add takes 1-d)"
    if source.shape[dim] != index.shape[0]:
        return f"{source.shape[dim]} source slices along dim {dim} for {index.shape[0]} indices"
    if any(a != b for d, (a, b) in enumerate(zip(self.shape, source.shape, strict=True)) if d != dim):
        return f"source shape {tuple(source.shape)} differs from self's {tuple(self.shape)} outside dim {dim}"
    alpha = _alpha_or_why(alpha, self.dtype)
    if alpha.__class__ is str:
        return alpha
    space = tuple(source.shape)
    return _finish(self, dim, space, Axes(0, index.stride(0), 0), source, inplace, alpha, index)


def _apart_why(plan: ScatterPlan, self: Tensor, dim: int, index: Tensor, source: Tensor, **_: Any) -> str | None:
    """Why an in-place call that ``plan`` would serve is declined: self's memory overlaps index's or
    source's, or cannot be told apart (tensor subclasses, FakeTensors among them). Runs per call."""
    for t in (self, index, source):
        if t.__class__ is not Tensor:
            return f"in place on a {t.__class__.__name__}: its memory cannot be told apart from the others'"
    start = self.data_ptr()
    end = start + plan.spans[0]
    for what, t, length in (("index", index, plan.spans[1]), ("source", source, plan.spans[2])):
        other = t.data_ptr()
        if other < end and start < other + length:
            return f"in place: self overlaps {what} in memory"
    return None


def _scatter(inplace: bool) -> Callable[..., ScatterPlan | str]:
    def plan_or_why(self: Tensor, dim: int, index: Tensor, src: Tensor) -> ScatterPlan | str:
        return _scatter_plan_or_why(self, dim, index, src, inplace)

    return plan_or_why


def _index(inplace: bool) -> Callable[..., ScatterPlan | str]:
    def plan_or_why(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any) -> ScatterPlan | str:
        return _index_plan_or_why(self, dim, index, source, inplace, alpha)

    return plan_or_why


def _check_bounds(status: Tensor, self: Tensor, dim: int, index: Tensor, plan: ScatterPlan, scatter: bool) -> None:
    """Raise what aten raises for an index out of range: on CUDA an asynchronous device assert;
    on CPU its kernels' own error, which for ``index_add`` depends on the path aten takes (its
    scatter path for int64 indices, alpha 1 and more than one dim; a per-slice check otherwise)."""
    size = self.shape[dim]
    if status.is_cuda:
        torch._assert_async(status[0], f"index out of bounds for dimension {dim} with size {size}")
    elif not status[0]:
        if scatter or (self.ndim > 1 and index.dtype == torch.int64 and plan.alpha is None):
            raise RuntimeError(f"index {int(status[1])} is out of bounds for dimension {dim} with size {size}")
        raise IndexError("index out of range in self")


def _run(self: Tensor, dim: int, index: Tensor, source: Tensor, plan: ScatterPlan | None, inplace: bool,
         scatter: bool) -> Tensor:
    if plan is None:
        raise ValueError(f"scatter/index add: the Triton kernel does not take these inputs (self {self.dtype} "
                         f"{tuple(self.shape)}, dim {dim}, index {index.dtype} {tuple(index.shape)}, source "
                         f"{source.dtype} {tuple(source.shape)}); see the module's docstring")
    dim %= self.ndim
    if inplace and plan.acc_dtype == self.dtype:
        _check_bounds(FAMILY.kernels().scatter_add_into(self, index, source, plan), self, dim, index, plan, scatter)
        return self
    out = self.to(plan.acc_dtype, memory_format=torch.contiguous_format, copy=True)
    _check_bounds(FAMILY.kernels().scatter_add_into(out, index, source, plan), self, dim, index, plan, scatter)
    if inplace:
        return self.copy_(out)
    return out if out.dtype == self.dtype else out.to(self.dtype)


def _impl(op: str, inplace: bool, scatter: bool) -> Callable[..., Tensor]:
    def impl(self: Tensor, dim: int, index: Tensor, source: Tensor, plan: ScatterPlan | None = None,
             **alpha: Any) -> Tensor:
        return _run(self, dim, index, source, plan or FAMILY[op].cond(self, dim, index, source, **alpha), inplace,
                    scatter)

    impl.__name__ = impl.__qualname__ = f"{op}_impl"
    return impl


def _indices(high: int, *shape: int, device: str) -> torch.Tensor:
    return torch.randint(0, high, shape, device=device)


def _scatter_cases(inplace: bool):
    """``verify``'s cases (index tensors captured by the calls, so the float64 run widens only the values)."""
    def call(s: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        if inplace:  # src cut to index's shape: the in-place backward rejects a larger one
            return s.clone().scatter_add_(dim, index, src[tuple(slice(n) for n in index.shape)])
        return s.scatter_add(dim, index, src)

    def cases(dtype: torch.dtype, device: str):
        moe = _indices(16, 64, 1, device=device).expand(64, 32)  # token -> row, broadcast along hidden
        yield Sample("expanded index (MoE)", lambda s, src: call(s, 0, moe, src),
                     [rand(16, 32, dtype=dtype, device=device), rand(64, 32, dtype=dtype, device=device)])
        full = _indices(7, 5, 9, device=device)
        yield Sample("dim 1, index smaller than src", lambda s, src: call(s, 1, full, src),
                     [rand(5, 7, dtype=dtype, device=device), rand(6, 12, dtype=dtype, device=device)])
        mid = _indices(4, 3, 6, 5, device=device)
        yield Sample("3-D, middle dim", lambda s, src: call(s, 1, mid, src),
                     [rand(3, 4, 5, dtype=dtype, device=device), rand(3, 6, 5, dtype=dtype, device=device)])
        back = _indices(10, 10, 3, device=device)
        yield Sample("transposed self, dim -2", lambda s, src: call(s, -2, back, src),
                     [rand(3, 10, dtype=dtype, device=device).t(), rand(10, 3, dtype=dtype, device=device)])
    return cases


def _index_add_cases(inplace: bool):
    """``verify``'s cases, as ``_scatter_cases``'s."""
    def call(s: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: float) -> torch.Tensor:
        if inplace:
            return s.clone().index_add_(dim, index, source, alpha=alpha)
        return torch.index_add(s, dim, index, source, alpha=alpha)

    def cases(dtype: torch.dtype, device: str):
        rows = _indices(16, 64, device=device)
        yield Sample("MoE combine", lambda s, src: call(s, 0, rows, src, 1),
                     [rand(16, 32, dtype=dtype, device=device), rand(64, 32, dtype=dtype, device=device)])
        cols = _indices(9, 20, device=device).to(torch.int32)
        yield Sample("dim 1, int32 index, alpha -2", lambda s, src: call(s, 1, cols, src, -2.0),
                     [rand(4, 9, dtype=dtype, device=device), rand(4, 20, dtype=dtype, device=device)])
        mid = _indices(5, 7, device=device)
        yield Sample("3-D, middle dim, alpha 0.5", lambda s, src: call(s, 1, mid, src, 0.5),
                     [rand(2, 5, 3, dtype=dtype, device=device), rand(2, 7, 3, dtype=dtype, device=device)])
        yield Sample("sliced source", lambda s, src: call(s, 0, rows[:10], src[:, ::2], 1),
                     [rand(16, 8, dtype=dtype, device=device), rand(10, 16, dtype=dtype, device=device)])
    return cases


def _row_inputs(scatter: bool) -> Callable[[tuple[int, ...], torch.dtype, str, bool], Tensors]:
    """A row's tensors: ``tokens x hidden`` source rows ``c`` added into ``rows x hidden`` zeros ``x``
    along dim 0 by one row ``index`` per token (scatter_add's: that column expanded along hidden, as
    MoE code does). The row's shape: tokens, hidden, rows."""

    def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> Tensors:
        tokens, hidden, rows = shape
        index = torch.randint(0, rows, (tokens,), device=device)
        return {"x": torch.zeros(rows, hidden, device=device, dtype=dtype), "leaves": [], "dy": None,
                "c": torch.randn(tokens, hidden, device=device, dtype=dtype),
                "index": index[:, None].expand(tokens, hidden) if scatter else index}

    return inputs


def _bench_row(op: str, scatter: bool) -> BenchRow:
    """Forward only: the source and one index per token read, self copied. Its LLM row: MoE combine,
    16384 token slots of hidden 4096 into 2048 token rows."""
    call = (lambda t: t["x"].scatter_add(0, t["index"], t["c"])) if scatter else (
        lambda t: t["x"].index_add(0, t["index"], t["c"]))
    moe = (16384, 4096, 2048)
    return BenchRow(op, ((64, 32, 16),), (moe, (32768, 2048, 4096), (8192, 7168, 1024)), _row_inputs(scatter), call,
                    lambda shape, mode, itemsize: shape[0] * (shape[1] * itemsize + 8)
                    + 2 * shape[2] * shape[1] * itemsize,
                    modes=FORWARD, llm=(LlmCase("fwd", moe), LlmCase("fwd", moe, torch.float32)))


def _op(op: str, inplace: bool, scatter: bool) -> Op:
    """Floats decline under deterministic algorithms (the atomics add them in no fixed order); an
    ``alpha`` beyond self's dtype declines (aten raises); in-place calls also check per call that
    self is apart from index and source in memory."""
    other = "src" if scatter else "source"
    key = ("self", "dim", "index", other, *(() if scatter else ("alpha.__class__", "alpha")))
    # The functional ops derive their out= forms (the result copied into out); the in-place ones add
    # straight into self, which a derived variant could not (it would add into a copy, then copy back).
    return Op(op, (_scatter if scatter else _index)(inplace), _impl(op, inplace, scatter), key, measured=False,
              check=_apart_why if inplace else None, options={} if inplace else {"derive_forms": ("out",)},
              bench=(op.rstrip("_"),), bench_rows=() if inplace else (_bench_row(op, scatter),),
              nondeterministic="the kernel's float atomics add in no fixed order",
              deterministic_when="not self.dtype.is_floating_point",
              verify=Driver((_scatter_cases if scatter else _index_add_cases)(inplace), () if inplace else (op,)))


FAMILY = Family(DSL_NAME, "scatter_add", [
    _op("scatter_add", False, True), _op("scatter_add_", True, True),
    _op("index_add", False, False), _op("index_add_", True, False),
], kernels="scatter_add")
