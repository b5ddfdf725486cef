"""``python_native::rotary``: rotary position embedding of q and k in one call.

Each attention module of a rotary model calls a module-level Python function
(``apply_rotary_pos_emb``) that rotates q and k as several small ops: two multiplies, a
``rotate_half`` (two slices, a negation, a concatenation) and an add, each for q and for k, each
with its own intermediate kept for the backward. This op is that function: its reference
computes, op for op, ``q * cos + rotate_half(q) * sin`` (and the same for k) with ``cos`` and
``sin`` unsqueezed at ``unsqueeze_dim``, where ``rotate_half(x) = cat(-x2, x1)`` of the two
halves of the last dim. ``rotary_backward`` maps the output gradients back (the transposed
rotation; for the usual ``cos``/``sin`` whose halves repeat, the rotation by ``-sin``). ``cos`` and
``sin`` take no gradient through it: when they require one, the autograd formula computes it in
plain torch.
"""

from __future__ import annotations

import torch

from python_native.foundations import custom_ops, module_scope, public_names

Tensor = torch.Tensor


def rotate_half(x: Tensor) -> Tensor:
    """``cat(-x2, x1)`` of the two halves of ``x``'s last dim, as the modeling modules write it."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_half_transposed(y: Tensor) -> Tensor:
    """The transpose of ``rotate_half`` (``cat(y2, -y1)``): how a gradient goes back through it."""
    y1 = y[..., : y.shape[-1] // 2]
    y2 = y[..., y.shape[-1] // 2 :]
    return torch.cat((y2, -y1), dim=-1)


def check_arguments(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> None:
    """``ValueError`` naming what the op cannot take (metadata only: FakeTensor safe)."""
    if cos.shape != sin.shape:
        raise ValueError(f"rotary: cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not -cos.dim() - 1 <= unsqueeze_dim <= cos.dim():
        raise ValueError(f"rotary: unsqueeze_dim={unsqueeze_dim} is out of range for cos of {cos.dim()} dims")
    for name, x in (("q", q), ("k", k)):
        if x.dim() != cos.dim() + 1 or x.shape[-1] != cos.shape[-1] or x.shape[-1] % 2:
            raise ValueError(f"rotary: {name} {tuple(x.shape)} must have one dim more than cos {tuple(cos.shape)} "
                             f"and its last dim, even")


def _reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    check_arguments(q, k, cos, sin, unsqueeze_dim)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def _reference_backward(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor,
                        unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        return tuple(g * cos + rotate_half_transposed(g * sin) for g in (grad_q, grad_k))


def _output(x: Tensor, cos: Tensor) -> Tensor:
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, cos.dtype))


def _fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    check_arguments(q, k, cos, sin, unsqueeze_dim)
    return _output(q, cos), _output(k, cos)


def _fake_backward(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return _output(grad_q, cos), _output(grad_k, cos)


def _setup_context(ctx, inputs, output) -> None:
    q, k, cos, sin, unsqueeze_dim = inputs
    table_grad = cos.requires_grad or sin.requires_grad
    # q and k are kept only when cos or sin need their gradient.
    ctx.save_for_backward(cos, sin, *((q, k) if table_grad else ()))
    ctx.options = (unsqueeze_dim, q.dtype, k.dtype)
    ctx.module = module_scope.current()


def _table_grads(ctx, grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, q: Tensor,
                 k: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The gradients of ``cos`` and ``sin`` in plain torch, summed back to their shape."""
    dim = ctx.options[0]
    shape = cos.unsqueeze(dim).shape
    grads = []
    for table, of_q, of_k in ((cos, q, k), (sin, rotate_half(q), rotate_half(k))):
        grads.append((grad_q * of_q).sum_to_size(shape).squeeze(dim).to(table.dtype)
                     + (grad_k * of_k).sum_to_size(shape).squeeze(dim).to(table.dtype))
    needs = ctx.needs_input_grad
    return grads[0] if needs[2] else None, grads[1] if needs[3] else None


def _autograd_backward(ctx, grad_q, grad_k):
    # Read once: checkpointing (non-reentrant) and saved-tensor hooks allow one unpack per backward.
    saved = ctx.saved_tensors
    cos, sin = saved[:2]
    unsqueeze_dim, q_dtype, k_dtype = ctx.options
    with module_scope.inside(ctx.module):
        grad_q_in, grad_k_in = BACKWARD(grad_q, grad_k, cos, sin, unsqueeze_dim)
    needs = ctx.needs_input_grad
    grad_cos, grad_sin = _table_grads(ctx, grad_q, grad_k, *saved) if len(saved) > 2 else (None, None)
    return (grad_q_in.to(q_dtype) if needs[0] else None, grad_k_in.to(k_dtype) if needs[1] else None,
            grad_cos, grad_sin, None)


BACKWARD = custom_ops.declare(
    "rotary_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, int unsqueeze_dim) -> (Tensor, Tensor)",
    reference=_reference_backward, fake=_fake_backward, doc="gradients of rotary's q and k: the transposed rotation")
OP = custom_ops.declare("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1) -> (Tensor, Tensor)",
                      reference=_reference, fake=_fake, backward=_autograd_backward, setup_context=_setup_context,
                      doc="q * cos + rotate_half(q) * sin, and the same for k")
public_names.declare("rotary", "rotary")
public_names.declare("rotary", "rotary_backward", backward=True)


def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=...)`` as one op
    (``torch.ops.python_native.rotary``)."""
    return OP(q, k, cos, sin, unsqueeze_dim)


_sharding_registered = False


def register_dtensor_sharding() -> None:
    """DTensor's placements for ``rotary``, registered by ``pn.patch`` where DTensor is loaded
    (importing DTensor costs more than the op): q and k (or their gradients) sharded on the heads dim
    (``unsqueeze_dim``) with the tables replicated, or on the batch dim with the tables sharded alike
    (replicated where their batch is 1, broadcast), or everything replicated. The rotation mixes the
    halves of the last dim, so a shard of it is gathered first."""
    global _sharding_registered
    if _sharding_registered:
        return
    from torch.distributed.tensor import Replicate, Shard

    def placements(q, cos, unsqueeze_dim):
        heads = unsqueeze_dim if unsqueeze_dim >= 0 else unsqueeze_dim + q.ndim
        every = [([Replicate()] * 2, [Replicate()] * 4 + [None])]
        if 0 < heads < q.ndim - 1:
            every.append(([Shard(heads)] * 2, [Shard(heads)] * 2 + [Replicate()] * 2 + [None]))
        if heads != 0 and q.shape[0] > 1 and cos.shape[0] in (1, q.shape[0]):
            table = Replicate() if cos.shape[0] == 1 else Shard(0)
            every.append(([Shard(0)] * 2, [Shard(0)] * 2 + [table] * 2 + [None]))
        return every

    from torch.distributed.tensor.experimental import register_sharding

    @register_sharding(OP)
    def forward(q, k, cos, sin, unsqueeze_dim=1):
        return placements(q, cos, unsqueeze_dim)

    @register_sharding(BACKWARD)
    def backward(grad_q, grad_k, cos, sin, unsqueeze_dim):
        return placements(grad_q, cos, unsqueeze_dim)

    _sharding_registered = True
