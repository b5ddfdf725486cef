"""``python_native::rotary``: transformers' ``apply_rotary_pos_emb`` on q and k, forward and backward.

The op is declared by ``python_native.ops``; these overrides shadow its reference (several
pointwise aten calls per tensor, and the ``rotate_half`` concatenation) with one launch that
rotates q and k together, cos and sin read once per position however many heads share them
(``plans.rotary``). Any ``unsqueeze_dim`` whose broadcast fits q is taken, q and k at any
strides (transposed from ``(batch, seq, heads, dim)`` views, as attention modules make them, or
slices of wider heads). Dense results keep their operand's layout; others are
contiguous. cos and sin take no gradient here: the op's autograd computes theirs in plain torch.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from python_native.ops import rotary_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.spec import runtime_import

from ..plans.layout import dense_like
from ..plans.rotary import RotaryPlan, plan_rotary
from ..target import DSL_NAME
from . import why
from .planned import PlanOrReason, declared_spec

Tensor = torch.Tensor


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    with runtime_import(DSL_NAME):
        from python_native_dsls.triton.kernels import rotary

    return rotary


def _plan(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> RotaryPlan | str:
    """The launch rotating ``q`` and ``k`` (a backward's ``grad_q`` and ``grad_k``), or why not."""
    found = why.device(q, k, cos, sin)
    for what, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        found = found or why.dtype(t, f"{what} dtype")
    if found:
        return found
    if not (q.numel() and k.numel() and cos.numel()):
        return "empty input"
    return plan_rotary(q, k, cos, sin, unsqueeze_dim, (dense_like(q), dense_like(k)))


ROTARY = PlanOrReason(_plan)
ROTARY_BACKWARD = PlanOrReason(_plan)


def rotary_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1,
                plan: RotaryPlan | None = None) -> tuple[Tensor, Tensor]:
    return _kernels().run(q, k, cos, sin, plan or ROTARY.require(q, k, cos, sin, unsqueeze_dim), False)


def rotary_backward_impl(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
                         plan: RotaryPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or ROTARY_BACKWARD.require(grad_q, grad_k, cos, sin, unsqueeze_dim)
    return _kernels().run(grad_q, grad_k, cos, sin, plan, True)


OVERRIDES = [
    declared_spec("rotary", ROTARY, rotary_impl, "rotary"),
    declared_spec("rotary_backward", ROTARY_BACKWARD, rotary_backward_impl, "rotary", backward=True),
]
