"""Launch plan of the elementwise kernels (activations): one flat launch over every element."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .tiles import ELEMENTWISE_BLOCK, cdiv


class ElementwisePlan(NamedTuple):
    """One flat launch over ``n`` elements, worked out once per layout, dtype and activation."""

    n: int
    grid: tuple[int]
    act: int
    launch_key: tuple  # everything Triton specializes the launch on but pointer alignment


def plan_elementwise(x: torch.Tensor, act: int, grad: torch.Tensor | None = None) -> ElementwisePlan:
    """The launch over ``x`` (and ``grad``, for a backward), without checking that the kernel takes it."""
    n = x.numel()
    grad_dtype = None if grad is None else grad.dtype
    return ElementwisePlan(n, (cdiv(n, ELEMENTWISE_BLOCK),), act, (x.dtype, grad_dtype, n, act))
