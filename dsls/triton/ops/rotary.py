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
from python_native_dsls.proving import BenchRow, Driver, Sample, leaf, rand

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


def _ops():
    return torch.ops.python_native


def _cases(dtype: torch.dtype, device: str):
    """``verify``'s cases: q and k as attention modules make them (transposed, fewer key heads), positions
    shared by the batch, partial rotary slices of a wider head."""
    b, s, h, kv, d = 2, 5, 4, 2, 16
    angles = torch.rand(b, s, d // 2, device=device) * 6.0
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    q = rand(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)
    k = rand(b, s, kv, d, dtype=dtype, device=device).transpose(1, 2)
    yield Sample("q, k transposed, fewer key heads", lambda q, k, c, s: _ops().rotary(q, k, c, s, 1), [q, k, cos, sin])
    q, k = rand(b, s, h, d, dtype=dtype, device=device), rand(b, s, kv, d, dtype=dtype, device=device)
    yield Sample("unsqueeze_dim=2, positions shared by the batch",
                 lambda q, k, c, s: _ops().rotary(q, k, c, s, 2), [q, k, cos[:1], sin[:1]])
    q, k = rand(b, h, s, 24, dtype=dtype, device=device)[..., :d], rand(b, kv, s, 24, dtype=dtype, device=device)[..., :d]
    yield Sample("partial rotary slices", lambda q, k, c, s: _ops().rotary(q, k, c, s, 1), [q, k, cos, sin])


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
    """A row of shape (batch, seq, q heads, k heads, head dim): q and k transposed as attention modules make them."""
    b, s, h, kv, d = shape
    q = leaf(torch.randn(b, s, h, d, device=device, dtype=dtype).transpose(1, 2), grad)
    k = leaf(torch.randn(b, s, kv, d, device=device, dtype=dtype).transpose(1, 2), grad)
    angles = torch.arange(s, device=device)[:, None] * torch.rand(d // 2, device=device)
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype).expand(b, s, d) for f in (torch.cos, torch.sin))
    dy = (torch.randn_like(q), torch.randn_like(k)) if grad else None
    return {"q": q, "k": k, "cos": cos, "sin": sin, "leaves": [q, k] if grad else [], "dy": dy}


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _formula(t: dict) -> tuple[Tensor, Tensor]:
    """``apply_rotary_pos_emb`` as transformers writes it."""
    cos, sin = t["cos"].unsqueeze(1), t["sin"].unsqueeze(1)
    return t["q"] * cos + _rotate_half(t["q"]) * sin, t["k"] * cos + _rotate_half(t["k"]) * sin


def _bytes(shape: tuple[int, ...], mode: str, itemsize: int) -> int:
    """q and k in and out, the cos and sin tables in (the backward: all of it again)."""
    b, s, h, kv, d = shape
    return itemsize * (2 * b * s * (h + kv) * d + 2 * b * s * d) * (2 if mode == "fwd+bwd" else 1)


# 32 query and 8 key heads of 128 (Llama-3 8B's), at 4096 positions.
_BENCH = BenchRow("rotary", ((1, 4, 2, 1, 16),), ((1, 4096, 32, 8, 128), (4, 4096, 32, 8, 128)), _inputs,
                  lambda t: _ops().rotary(t["q"], t["k"], t["cos"], t["sin"], 1), _bytes, _formula)

FAMILY = Family(DSL_NAME, "rotary", [
    Op("rotary", forward_plan_or_why, rotary_impl, ("q", "k", "cos", "sin", "unsqueeze_dim"), public_name="rotary",
       measured=False, lib=NAMESPACE, verify=Driver(_cases), bench_rows=(_BENCH,)),
    Op("rotary_backward", backward_plan_or_why, rotary_backward_impl,
       ("grad_q", "grad_k", "cos", "sin", "unsqueeze_dim"), public_name="rotary", backward=True, measured=False,
       lib=NAMESPACE, bench=("rotary",)),
], kernels="rotary")
