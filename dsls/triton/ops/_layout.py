"""Shape and stride checks shared by the conds and impls (metadata only, FakeTensor safe).

Row kernels see a tensor as ``n_rows x n_cols`` with one stride per axis. Any tensor whose
leading dims and whose reduced dims each collapse to one evenly strided axis fits, which covers
contiguous tensors, row slices of wider buffers and the all-zero strides of expanded gradients
without a copy.

Conds and impls share the analysis through per-layout caches: the cond of a call computes a row
view once per ``(sizes, strides, dims)`` and the impl it selects finds it there instead of
recomputing it. Only exact ``torch.Tensor`` layouts are cached (FakeTensors, whose sizes may be
symbolic, are analysed directly: conds stay metadata-only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

import python_native_dsls.triton as backend
from python_native.speckey import MISSING, SpecializationCache

FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})

# Offsets within a row (and within a flat elementwise launch) are int32 in the kernels; rows are
# addressed with int64, so row kernels take any number of rows. The headroom keeps the last
# block's masked lanes from wrapping around.
MAX_INDEX = 2**31 - 2**20
# Longest rows the single-block norm kernels hold in registers without spilling on an H100
# (the backward also keeps the weight and two gradient accumulators live). Longer rows go to aten.
MAX_NORM_COLS = 16384
MAX_NORM_BWD_COLS = 1 << 24  # the backward streams rows wider than its register tile


class Rows(NamedTuple):
    """A tensor viewed as a strided matrix."""

    n_rows: int
    n_cols: int
    row_stride: int
    col_stride: int


@functools.cache
def backend_device() -> str:
    """The device type the kernels run on, fixed once the overrides are installed at their key
    (``all_overrides`` clears this cache so that a re-registration sees the current mode)."""
    return backend.device_type()


def on_backend(*tensors: torch.Tensor | None) -> bool:
    """Every given tensor lives on the device the kernels run on (None entries are skipped)."""
    # ``is_cuda`` / ``is_cpu`` are plain flags; ``t.device`` would build a device object per tensor.
    if backend_device() == "cuda":
        for t in tensors:
            if t is not None and not t.is_cuda:
                return False
        return True
    for t in tensors:
        if t is not None and not t.is_cpu:
            return False
    return True


def float_dtype(t: torch.Tensor) -> bool:
    return t.dtype in FLOAT_DTYPES


def collapse(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """``(numel, stride)`` when the dims form a single evenly strided axis, else None."""
    numel, stride, expected = 1, None, 0
    for size, step in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride is None:
            stride = step
        elif step != expected:
            return None
        expected = step * size
        numel *= size
    return numel, 1 if stride is None else stride


def _as_rows(t: torch.Tensor, n_inner: int) -> Rows | None:
    if n_inner < 1 or n_inner > t.ndim:
        return None
    axis = t.ndim - n_inner
    if t.is_contiguous():
        n_cols = math.prod(t.shape[axis:])
        return Rows(t.numel() // n_cols, n_cols, n_cols, 1) if n_cols else None
    sizes, strides = tuple(t.shape), t.stride()
    inner = collapse(sizes[axis:], strides[axis:])
    outer = collapse(sizes[:axis], strides[:axis])
    if inner is None or outer is None:
        return None
    return Rows(outer[0], inner[0], outer[1], inner[1])


def _reduced_rows(t: torch.Tensor, dim: int) -> Rows | None:
    if t.ndim == 0 or not -t.ndim <= dim < t.ndim:
        return None
    dim %= t.ndim
    if any(size != 1 for size in t.shape[dim + 1 :]):
        return None
    return _as_rows(t, t.ndim - dim)


_AS_ROWS: SpecializationCache[Rows | None] = SpecializationCache(_as_rows, 4096)
_REDUCED_ROWS: SpecializationCache[Rows | None] = SpecializationCache(_reduced_rows, 4096)
_Tensor = torch.Tensor


def as_rows(t: torch.Tensor, n_inner: int) -> Rows | None:
    """View ``t`` as rows of its last ``n_inner`` dims, or None when no single stride pair fits."""
    if type(t) is not _Tensor:
        return _as_rows(t, n_inner)
    return _AS_ROWS.get((t.size(), t.stride(), n_inner), t, n_inner)


def reduced_rows(t: torch.Tensor, dim: int) -> Rows | None:
    """Rows for a reduction over ``dim`` alone: every later dim must have size 1."""
    if type(t) is not _Tensor:
        return _reduced_rows(t, dim)
    return _REDUCED_ROWS.get((t.size(), t.stride(), dim), t, dim)


def normalized_axis(t: torch.Tensor, normalized_shape: Sequence[int]) -> int | None:
    """First normalized dim when ``t`` ends with ``normalized_shape``, else None."""
    n = len(normalized_shape)
    if n == 0 or n > t.ndim or tuple(t.shape[t.ndim - n :]) != tuple(normalized_shape):
        return None
    return t.ndim - n


class NormPlan(NamedTuple):
    """How the norm kernels see an input: its rows, the shape of its per-row statistics, and the
    forward launch (tile and grid), all fixed by the input's layout."""

    rows: Rows
    stat_shape: tuple[int, ...]
    param_size: torch.Size  # what a weight or bias must be shaped as
    fresh_like: bool  # the input is contiguous: torch.empty_like(x) is the output's layout
    grid: tuple[int, ...]
    num_warps: int
    block_m: int
    block_n: int


def _norm_plan(x: torch.Tensor, normalized_shape: tuple[int, ...], max_cols: int) -> NormPlan | None:
    from ._tiles import MAX_ROW_BLOCK, cdiv, row_config  # (_tiles builds on this module)

    axis = normalized_axis(x, normalized_shape)
    if axis is None:
        return None
    rows = _as_rows(x, len(normalized_shape))
    if not row_fits(rows) or rows.n_cols > max_cols:
        return None
    if rows.n_cols > MAX_ROW_BLOCK:  # the backward streams such rows; no forward launch to plan
        grid, warps, block_m, block_n = (), 0, 0, 0
    else:
        cfg = row_config(rows.n_rows, rows.n_cols)
        grid, warps, block_m, block_n = (cdiv(rows.n_rows, cfg.block_m),), cfg.num_warps, cfg.block_m, cfg.block_n
    return NormPlan(
        rows, tuple(stat_shape(x, axis)), torch.Size(normalized_shape), x.is_contiguous(), grid, warps, block_m, block_n
    )


_NORM_PLANS: SpecializationCache[NormPlan | None] = SpecializationCache(_norm_plan, 4096)
_norm_lookup = _NORM_PLANS.lookup


def norm_plan(x: torch.Tensor, normalized_shape: Sequence[int], max_cols: int = MAX_NORM_COLS) -> NormPlan | None:
    """The plan for a float ``x`` normalized over its trailing ``normalized_shape``, when the
    single-block norm kernels handle its rows (up to ``max_cols`` long), else None."""
    if x.dtype not in FLOAT_DTYPES:
        return None
    shape = tuple(normalized_shape)
    if x.__class__ is not _Tensor:
        return _norm_plan(x, shape, max_cols)
    key = (x.size(), x.stride(), shape, max_cols)
    plan = _norm_lookup(key, MISSING)
    return _NORM_PLANS.get(key, x, shape, max_cols) if plan is MISSING else plan


def stats_ok(stat: torch.Tensor, x: torch.Tensor, n_rows: int) -> bool:
    """Saved per-row statistics the backward kernels can read as a flat vector."""
    return stat.numel() == n_rows and stat.dtype in (x.dtype, torch.float32) and stat.is_contiguous()


def stat_shape(t: torch.Tensor, axis: int) -> list[int]:
    """Shape of per-row statistics as aten returns them: leading dims kept, the rest size 1."""
    return [*t.shape[:axis], *([1] * (t.ndim - axis))]


def param_ok(p: torch.Tensor | None, size: tuple[int, ...], dtype: torch.dtype) -> bool:
    """An optional affine parameter: absent, or contiguous with shape ``size`` and ``dtype``.
    ``size`` is a tuple (a plan's ``param_size``), which a tensor's shape compares to without copies."""
    return p is None or (p.dtype == dtype and p.shape == size and p.is_contiguous())


def is_param(p: torch.Tensor | None, shape: Sequence[int], dtype: torch.dtype) -> bool:
    """``param_ok`` for a shape given as any sequence (``normalized_shape`` may be a list)."""
    return param_ok(p, tuple(shape), dtype)


def row_fits(r: Rows | None) -> bool:
    """A non-empty row view whose in-row offsets stay within int32."""
    return r is not None and r.n_rows > 0 and 0 < r.n_cols and (r.n_cols - 1) * r.col_stride <= MAX_INDEX


def dense_like(t: torch.Tensor, *others: torch.Tensor) -> bool:
    """``t`` covers its memory densely without overlap and ``others`` share its shape and strides.

    Such tensors can be processed as flat arrays from their first element, in any dim order
    (contiguous, channels-last, transposed, ...).
    """
    if others:
        # Equal strides and shapes: both contiguous settles it without building stride tuples.
        if t.is_contiguous():
            return all(o.is_contiguous() and o.shape == t.shape for o in others)
        if any(o.shape != t.shape or o.stride() != t.stride() for o in others):
            return False
    elif t.is_contiguous():
        return True
    dims = sorted((step, size) for size, step in zip(t.shape, t.stride(), strict=True) if size != 1)
    expected = 1
    for step, size in dims:
        if step != expected:
            return False
        expected *= size
    return True


def fits_index(t: torch.Tensor) -> bool:
    """Non-empty and small enough for the flat (int32-indexed) elementwise kernels."""
    return 0 < t.numel() <= MAX_INDEX
