"""Why a cond declined: the conds' checks re-run one by one, each answering in words.

Only traced routers ask (see ``OverrideSpec.explain``), and only for calls the cond declined, so
these run the checks again rather than slowing the conds down to record which one failed. Each
helper returns the first failing check's reason, or None where its checks pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from python_native_dsls.layout import FLOAT_DTYPES, Rows, normalized_axis, view_rows

from ..plans.elementwise import unit_rows
from ..plans.layout import MAX_INDEX, MAX_NORM_COLS, backend_device, dense_like, on_backend, row_fits


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def names(dtypes: Iterable[torch.dtype]) -> str:
    """``dtypes`` as a sorted list in words (``"bfloat16, float16, float32"``)."""
    return ", ".join(sorted(name(d) for d in dtypes))


_FLOATS = names(FLOAT_DTYPES)


def device(*tensors: torch.Tensor | None) -> str | None:
    """Some tensor is not on the device the kernels run on."""
    if on_backend(*tensors):
        return None
    found = sorted({t.device.type for t in tensors if t is not None})
    return f"device {'/'.join(found)}: the kernels run on {backend_device()} here"


def dtype(t: torch.Tensor, what: str = "dtype") -> str | None:
    """``t`` is not of a float dtype the kernels take."""
    return None if t.dtype in FLOAT_DTYPES else f"{what} {name(t.dtype)} (the kernels take {_FLOATS})"


def same(t: torch.Tensor, other: torch.Tensor, what: str) -> str | None:
    """``other`` (named ``what``) differs from ``t`` in dtype or shape."""
    if other.dtype != t.dtype:
        return f"{what} dtype {name(other.dtype)} differs from the input's {name(t.dtype)}"
    if other.shape != t.shape:
        return f"{what} shape {tuple(other.shape)} differs from the input's {tuple(t.shape)}"
    return None


def rows(r: Rows | None, what: str = "rows") -> str | None:
    """A row view the row kernels cannot take: none, empty, or offsets beyond int32."""
    if r is None:
        return f"layout: the {what} do not form one strided row axis"
    if r.n_rows == 0 or r.n_cols == 0:
        return "empty input"
    return None if row_fits(r) else f"{what} too long: in-row offsets exceed int32"


def reduced(t: torch.Tensor, dim: int, r: Rows | None) -> str | None:
    """A reduction over ``dim`` the row kernels cannot take."""
    if t.ndim == 0:
        return "a 0-d input"
    if -t.ndim <= dim < t.ndim and any(size != 1 for size in t.shape[dim % t.ndim + 1:]):
        return f"dim {dim} is not the last dim of size > 1"
    return rows(r)


def norm(x: torch.Tensor, normalized_shape: Sequence[int], max_cols: int = MAX_NORM_COLS) -> str | None:
    """Why ``norm_plan(x, normalized_shape, max_cols)`` is None."""
    why = dtype(x)
    if why:
        return why
    if normalized_axis(x, normalized_shape) is None:
        return f"normalized_shape {tuple(normalized_shape)} is not the trailing shape of {tuple(x.shape)}"
    r = view_rows(x, len(normalized_shape))
    why = rows(r)
    if why:
        return why
    return f"rows of width {r.n_cols} exceed the kernel's {max_cols}" if r.n_cols > max_cols else None


def param(p: torch.Tensor | None, what: str, size: Sequence[int], x: torch.Tensor) -> str | None:
    """An affine parameter the kernels cannot read (``param_ok`` spelled out)."""
    if p is None:
        return None
    if p.dtype != x.dtype:
        return f"{what} dtype {name(p.dtype)} differs from the input's {name(x.dtype)}"
    if tuple(p.shape) != tuple(size):
        return f"{what} shape {tuple(p.shape)} is not {tuple(size)}"
    return None if p.is_contiguous() else f"{what} is not contiguous"


def stats(stat: torch.Tensor, what: str, x: torch.Tensor, n_rows: int) -> str | None:
    """Saved statistics the backward kernels cannot read (``stats_ok`` spelled out)."""
    if stat.numel() != n_rows:
        return f"{what} has {stat.numel()} values for {n_rows} rows"
    if stat.dtype not in (x.dtype, torch.float32):
        return f"{what} dtype {name(stat.dtype)}"
    return None if stat.is_contiguous() else f"{what} is not contiguous"


def elementwise(x: torch.Tensor, *others: torch.Tensor, rows: str | None = None) -> str | None:
    """A flat elementwise launch the kernels cannot take (dtype, size, layout); ``rows``: the
    kernels also take row views, each operand at its own strides (``"unit"``: with a contiguous
    last dim; ``"any"``: any column stride)."""
    why = device(x, *others) or dtype(x)
    if why:
        return why
    for o in others:
        if o.dtype != x.dtype:
            return f"grad dtype {name(o.dtype)} differs from the input's {name(x.dtype)}"
    if x.numel() == 0:
        return "empty input"
    if x.numel() > MAX_INDEX:
        return f"{x.numel()} elements exceed int32 indexing"
    if dense_like(x, *others):
        return None
    if rows and all(o.shape == x.shape for o in others):
        if all(unit_rows(t, rows == "unit") is not None for t in (x, *others)):
            return None
        if rows == "unit":
            return "layout: neither dense nor rows with a contiguous last dim"
        return "layout: the leading dims do not collapse to one row stride"
    if others:
        return "layout: operands differ in shape or strides, or are not dense"
    return "layout: not dense (a broadcast or gappy view)"


def pointwise(*named: tuple[str, torch.Tensor]) -> str | None:
    """Operands of one shape and dtype that the row-tiled pointwise kernels cannot take: device,
    dtype, shape, emptiness, or leading dims that do not collapse to one row stride."""
    (first_name, first), *others = named
    found = device(*(t for _, t in named)) or dtype(first, f"{first_name} dtype")
    if found:
        return found
    for what, t in others:
        if t.dtype != first.dtype:
            return f"{what} dtype {name(t.dtype)} differs from {first_name}'s {name(first.dtype)}"
        if t.shape != first.shape:
            return f"{what} shape {tuple(t.shape)} differs from {first_name}'s {tuple(first.shape)}"
    if first.numel() == 0:
        return "empty input"
    for what, t in named:
        if unit_rows(t, unit=False) is None:
            return f"layout: the leading dims of {what} (strides {tuple(t.stride())}) do not collapse to one row stride"
    return None
