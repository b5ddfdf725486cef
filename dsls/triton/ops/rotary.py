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

import torch

from python_native.ops import rotary_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.family import Family, Op

from ..plans.layout import MAX_INDEX, dense_like
from ..plans.rotary import RotaryPlan, plan_rotary
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
NAMESPACE = "python_native"


def _plan_or_why(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> RotaryPlan | str:
    """The launch rotating ``q`` and ``k`` (a backward's ``grad_q`` and ``grad_k``), or why not."""
    found = why.device(q, k, cos, sin)
    for what, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        found = found or why.dtype(t, f"{what} dtype")
    if found:
        return found
    if not (q.numel() and k.numel() and cos.numel()):
        return "empty input"
    found = _int32_why(q, k, cos, sin)
    if found:
        return found
    return plan_rotary(q, k, cos, sin, unsqueeze_dim, (dense_like(q), dense_like(k)))


def _int32_why(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> str | None:
    """Why the kernel's int32 offsets could pass 2**31: positions times cos/sin strides, and head-dim
    columns times q's or k's last stride, are int32 arithmetic (heads are widened to int64)."""
    for what, t in (("cos", cos), ("sin", sin)):
        if sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True)) > MAX_INDEX:
            return f"{what} spans more than {MAX_INDEX} elements: the kernel's offsets into it are int32"
    for what, t in (("q", q), ("k", k)):
        if (t.shape[-1] - 1) * abs(t.stride(-1)) > MAX_INDEX:
            return f"{what}'s head dim spans more than {MAX_INDEX} elements: its in-head offsets are int32"
    return None


def forward_plan_or_why(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> RotaryPlan | str:
    return _plan_or_why(q, k, cos, sin, unsqueeze_dim)


def backward_plan_or_why(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor,
                         unsqueeze_dim: int) -> RotaryPlan | str:
    """The backward rotates the gradients by -sin: the same launch over them."""
    return _plan_or_why(grad_q, grad_k, cos, sin, unsqueeze_dim)


def rotary_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1,
                plan: RotaryPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or FAMILY["rotary"].require(q, k, cos, sin, unsqueeze_dim)
    return FAMILY.kernels().run(q, k, cos, sin, plan, False)


def rotary_backward_impl(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int,
                         plan: RotaryPlan | None = None) -> tuple[Tensor, Tensor]:
    plan = plan or FAMILY["rotary_backward"].require(grad_q, grad_k, cos, sin, unsqueeze_dim)
    return FAMILY.kernels().run(grad_q, grad_k, cos, sin, plan, True)


FAMILY = Family(DSL_NAME, "rotary", [
    Op("rotary", forward_plan_or_why, rotary_impl, ("q", "k", "cos", "sin", "unsqueeze_dim"), public_name="rotary",
       measured=False, lib=NAMESPACE, bench=("rotary",)),
    Op("rotary_backward", backward_plan_or_why, rotary_backward_impl,
       ("grad_q", "grad_k", "cos", "sin", "unsqueeze_dim"), public_name="rotary", backward=True, measured=False,
       lib=NAMESPACE, bench=("rotary",)),
], kernels="rotary")
