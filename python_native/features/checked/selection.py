"""Ties: ops that return the indices of selected elements, where aten names any of equal ones.

``topk``, unstable ``sort`` and ``argsort``, and ``max.dim``, ``min.dim``, ``median.dim``,
``nanmedian.dim``, ``mode`` and ``kthvalue`` promise values, not which of several equal elements
an index names (torch's documentation says so for each; ``argmax`` and ``argmin`` do promise the
first one, and stay compared with aten bit for bit, as do ``sort`` and ``argsort`` with
``stable=True``). The contract: each output has aten's dtype, shape, device and contiguity; the
values are aten's within the dtype's tolerance (as a set where ``topk`` is unsorted); each index
is within the dim and names an element equal to the value returned beside it (NaN to NaN), and
the indices of ``topk``, ``sort`` and ``argsort`` are distinct.
"""

from __future__ import annotations

from typing import Any

import torch

from .compare import compare, first_difference, pairs, same_values, values_close
from .contracts import Call, Contract, broken

TIES = "ties"


def _along(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
    """``x`` with at least one dim, and ``dim`` made non-negative (a 0-d tensor is one element)."""
    if x.ndim == 0:
        return x.reshape(1), 0
    return x, dim % x.ndim


def _ones(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1) if t.ndim == 0 else t


def _valid(index: torch.Tensor, size: int, where: str) -> None:
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        bad = (index < 0) | (index >= size)
        raise broken(where, TIES, f"indices {sorted(set(index[bad].tolist()))[:8]} are outside the dim's "
                                  f"size {size} ({first_difference(~bad)})")


def _distinct(index: torch.Tensor, dim: int, where: str) -> None:
    if index.shape[dim] > 1:
        ordered = index.sort(dim).values
        repeats = ordered.diff(dim=dim) == 0
        if bool(repeats.any()):
            raise broken(where, TIES, f"an index appears twice along dim {dim} ({first_difference(~repeats)})")


def _points_at(x: torch.Tensor, dim: int, index: torch.Tensor, values: torch.Tensor, where: str) -> None:
    """Each index names an element equal to the value returned beside it."""
    same = same_values(x.gather(dim, index), values)
    if not bool(same.all()):
        raise broken(where, TIES, f"an index names an element that differs from the value returned with it "
                                  f"({first_difference(same)})")


def topk(call: Call, actual: Any, expected: Any, where: str) -> None:
    (values, index, at), (expected_values, _, _) = _two(actual, expected, where)
    x, dim = _along(call["self"], call["dim"])
    values, index, expected_values = _ones(values), _ones(index), _ones(expected_values)
    _valid(index, x.shape[dim], where)
    _distinct(index, dim, where)
    _points_at(x, dim, index, values, where)
    if not call["sorted"]:  # torch promises no order: the same values, as a set
        values, expected_values = values.sort(dim).values, expected_values.sort(dim).values
    values_close(values, expected_values, at, " in its values")


def sort(call: Call, actual: Any, expected: Any, where: str) -> None:
    if call.get("stable"):  # a stable sort fixes the order of ties: aten's bits
        compare(actual, expected, where)
        return
    (values, index, at), (expected_values, _, _) = _two(actual, expected, where)
    x, dim = _along(call["self"], call["dim"])
    index = _ones(index)
    _valid(index, x.shape[dim], where)
    _distinct(index, dim, where)
    _points_at(x, dim, index, _ones(values), where)
    values_close(values, expected_values, at, " in its values")


def argsort(call: Call, actual: Any, expected: Any, where: str) -> None:
    if call.get("stable"):
        compare(actual, expected, where)
        return
    pairs(actual, expected, where)
    x, dim = _along(call["self"], call["dim"])
    index, expected_index = _ones(actual), _ones(expected)
    _valid(index, x.shape[dim], where)
    _distinct(index, dim, where)
    same = same_values(x.gather(dim, index), x.gather(dim, expected_index))
    if not bool(same.all()):
        raise broken(where, TIES, f"the indices do not sort the input as aten's do ({first_difference(same)})")


def reduced(call: Call, actual: Any, expected: Any, where: str) -> None:
    """``max.dim`` and its kin: ``(values, indices)`` of one element per reduced row."""
    (values, index, at), (expected_values, _, _) = _two(actual, expected, where)
    x, dim = _along(call["self"], call["dim"])
    if call["self"].ndim == 0:
        kept_values, kept_index = values.reshape(1), index.reshape(1)
    elif call["keepdim"]:
        kept_values, kept_index = values, index
    else:
        kept_values, kept_index = values.unsqueeze(dim), index.unsqueeze(dim)
    _valid(kept_index, x.shape[dim], where)
    _points_at(x, dim, kept_index, kept_values, where)
    values_close(values, expected_values, at, " in its values")


def _two(actual: Any, expected: Any, where: str) -> tuple[tuple[Any, Any, str], tuple[Any, Any, str]]:
    """``(values, indices, where)`` of the override's result and of aten's, kinds checked."""
    (values, expected_values, at), (index, expected_index, _) = pairs(actual, expected, where)
    return (values, index, at), (expected_values, expected_index, at)


CONTRACTS: dict[str, Contract] = {
    "topk": Contract(TIES, topk),
    "sort": Contract(TIES, sort),
    "sort.stable": Contract(TIES, sort),
    "argsort": Contract(TIES, argsort),
    "argsort.stable": Contract(TIES, argsort),
    **{op: Contract(TIES, reduced) for op in (
        "max.dim", "min.dim", "median.dim", "nanmedian.dim", "mode", "kthvalue")},
}
