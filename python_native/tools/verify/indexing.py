"""Drivers of the indexing ops: top-k, scatter-add and index-add (functional and in place).

Index tensors are captured by the sample functions rather than passed as inputs, so that the
float64 reference run widens only the values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from python_native.tools.verify.samples import Driver, Sample, rand


def _topk_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    x = rand(6, 100, dtype=dtype, device=device)
    yield Sample("k=8 largest", lambda t: torch.topk(t, 8).values, [x])
    yield Sample("k=40 smallest (sorting path)", lambda t: torch.topk(t, 40, largest=False).values, [x])
    # sorted=False promises no order: compare the sets, as sorted lists.
    yield Sample("unsorted", lambda t: torch.topk(t, 8, sorted=False).values.sort(-1, descending=True).values, [x])
    special = rand(3, 50, dtype=dtype, device=device)
    special[0, 3] = special[1, :10] = float("nan")
    special[0, 7], special[2, 1], special[2, 2] = float("inf"), float("-inf"), -0.0
    yield Sample("NaN and inf, largest", lambda t: torch.topk(t, 12).values, [special])
    yield Sample("NaN and inf, smallest", lambda t: torch.topk(t, 45, largest=False).values, [special])
    yield Sample("transposed", lambda t: torch.topk(t, 3, dim=1).values, [rand(33, 4, dtype=dtype, device=device).t()])
    yield Sample("middle dim", lambda t: torch.topk(t, 4, dim=1).values, [rand(4, 10, 5, dtype=dtype, device=device)])
    yield Sample("wide row, chunked", lambda t: torch.topk(t, 8).values, [rand(1, 9000, dtype=dtype, device=device)])


def _index(high: int, *shape: int, device: str) -> torch.Tensor:
    return torch.randint(0, high, shape, device=device)


def _scatter_cases(inplace: bool) -> Callable[[torch.dtype, str], Iterator[Sample]]:
    def call(s: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        if inplace:  # src cut to index's shape: the in-place backward rejects a larger one
            return s.clone().scatter_add_(dim, index, src[tuple(slice(n) for n in index.shape)])
        return s.scatter_add(dim, index, src)

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        moe = _index(16, 64, 1, device=device).expand(64, 32)  # token -> row, broadcast along hidden
        yield Sample("expanded index (MoE)", lambda s, src: call(s, 0, moe, src),
                     [rand(16, 32, dtype=dtype, device=device), rand(64, 32, dtype=dtype, device=device)])
        full = _index(7, 5, 9, device=device)
        yield Sample("dim 1, index smaller than src", lambda s, src: call(s, 1, full, src),
                     [rand(5, 7, dtype=dtype, device=device), rand(6, 12, dtype=dtype, device=device)])
        mid = _index(4, 3, 6, 5, device=device)
        yield Sample("3-D, middle dim", lambda s, src: call(s, 1, mid, src),
                     [rand(3, 4, 5, dtype=dtype, device=device), rand(3, 6, 5, dtype=dtype, device=device)])
        back = _index(10, 10, 3, device=device)
        yield Sample("transposed self, dim -2", lambda s, src: call(s, -2, back, src),
                     [rand(3, 10, dtype=dtype, device=device).t(), rand(10, 3, dtype=dtype, device=device)])
    return cases


def _index_add_cases(inplace: bool) -> Callable[[torch.dtype, str], Iterator[Sample]]:
    def call(s: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: float) -> torch.Tensor:
        if inplace:
            return s.clone().index_add_(dim, index, source, alpha=alpha)
        return torch.index_add(s, dim, index, source, alpha=alpha)

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        rows = _index(16, 64, device=device)
        yield Sample("MoE combine", lambda s, src: call(s, 0, rows, src, 1),
                     [rand(16, 32, dtype=dtype, device=device), rand(64, 32, dtype=dtype, device=device)])
        cols = _index(9, 20, device=device).to(torch.int32)
        yield Sample("dim 1, int32 index, alpha -2", lambda s, src: call(s, 1, cols, src, -2.0),
                     [rand(4, 9, dtype=dtype, device=device), rand(4, 20, dtype=dtype, device=device)])
        mid = _index(5, 7, device=device)
        yield Sample("3-D, middle dim, alpha 0.5", lambda s, src: call(s, 1, mid, src, 0.5),
                     [rand(2, 5, 3, dtype=dtype, device=device), rand(2, 7, 3, dtype=dtype, device=device)])
        yield Sample("sliced source", lambda s, src: call(s, 0, rows[:10], src[:, ::2], 1),
                     [rand(16, 8, dtype=dtype, device=device), rand(10, 16, dtype=dtype, device=device)])
    return cases


DRIVERS: dict[str, Driver] = {
    "topk": Driver(_topk_cases, ("topk",)),
    "scatter_add": Driver(_scatter_cases(False), ("scatter_add",)),
    "scatter_add_": Driver(_scatter_cases(True)),
    "index_add": Driver(_index_add_cases(False), ("index_add",)),
    "index_add_": Driver(_index_add_cases(True)),
}
