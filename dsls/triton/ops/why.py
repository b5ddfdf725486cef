"""Why the Triton kernels decline a call: the checks of their limits, each answering in words.

The families' ``plan_or_why`` functions chain these (and the shared ones of
``python_native_dsls.why``, re-exported here) and return their plan where none has anything
to say. Each helper returns the first failing check's reason, or None where its checks pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from python_native_dsls.layout import Rows, as_rows
from python_native_dsls.why import dtype, name, names, normalized, param, reduced_dim, same

from ..plans.elementwise import unit_rows
from ..plans.layout import MAX_INDEX, MAX_NORM_BWD_COLS, MAX_NORM_COLS, backend_device, dense_like, on_backend, row_fits

__all__ = ["device", "dtype", "elementwise", "name", "names", "norm_rows", "param", "pointwise", "reduced", "rows", "same",
           "stats"]


def device(*tensors: torch.Tensor | None) -> str | None:
    """Some tensor is not on the device the kernels run on."""
    if on_backend(*tensors):
        return None
    found = sorted({t.device.type for t in tensors if t is not None})
    return f"device {'/'.join(found)}: the kernels run on {backend_device()} here"


def rows(r: Rows | None, what: str = "rows") -> str | None:
    """A row view the row kernels cannot take: none, empty, or offsets beyond int32."""
    if r is None:
        return f"layout: the {what} do not form one strided row axis"
    if r.n_rows == 0 or r.n_cols == 0:
        return "empty input"
    if r.n_rows > MAX_INDEX:
        return f"{r.n_rows} {what} exceed int32 row indices (at most {MAX_INDEX})"
    return None if row_fits(r) else f"{what} too long: in-row offsets exceed int32"


def reduced(t: torch.Tensor, dim: int, r: Rows | None) -> str | None:
    """A reduction over ``dim`` the row kernels cannot take."""
    return reduced_dim(t, dim) or rows(r)


def norm_rows(x: torch.Tensor, normalized_shape: Sequence[int], backward: bool) -> Rows | str:
    """``x``'s rows where the norm kernels take them (the backward streams longer rows), else why not."""
    found = dtype(x) or normalized(x, normalized_shape)
    if found:
        return found
    r = as_rows(x, len(normalized_shape))
    max_cols = MAX_NORM_BWD_COLS if backward else MAX_NORM_COLS
    found = rows(r)
    if found:
        return found
    return f"rows of width {r.n_cols} exceed the kernel's {max_cols}" if r.n_cols > max_cols else r


def stats(stat: torch.Tensor, what: str, x: torch.Tensor, n_rows: int) -> str | None:
    """Saved per-row statistics the backward kernels cannot read as a flat vector."""
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
