"""``bmm`` when the inner dimension is 1: a batched outer product, any input strides."""

from __future__ import annotations

import torch

from . import OverrideSpec
from ._layout import MAX_INDEX, float_dtype, on_backend

Tensor = torch.Tensor


def bmm_cond(self: Tensor, mat2: Tensor) -> bool:
    if not (on_backend(self, mat2) and float_dtype(self) and mat2.dtype == self.dtype):
        return False
    if self.ndim != 3 or mat2.ndim != 3 or self.shape[2] != 1 or mat2.shape[1] != 1:
        return False
    batch, m, n = self.shape[0], self.shape[1], mat2.shape[2]
    # The flat program grid is int32.
    return mat2.shape[0] == batch and batch > 0 and m > 0 and n > 0 and batch * m <= MAX_INDEX and n <= MAX_INDEX


def bmm_impl(self: Tensor, mat2: Tensor) -> Tensor:
    from python_native_dsls.triton.kernels import bmm_outer

    return bmm_outer.outer(self, mat2)


OVERRIDES = [OverrideSpec("bmm", bmm_cond, bmm_impl)]
