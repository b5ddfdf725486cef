"""``python_native::swiglu`` and ``python_native::geglu``: the gated activation of an MLP.

A gated MLP computes ``down(act(gate(x)) * up(x))``; in plain torch the activation and the product
are two kernels and autograd keeps both operands and the activation's output. These ops take the
two halves, ``gate`` and ``up`` (the outputs of separate projections, or the two halves of a fused
``gate_up`` projection's ``chunk(2, -1)``: row-strided views, which the overrides take without a
copy), and return ``act(gate) * up``. References are what the modules compute:
``F.silu(gate) * up`` and ``F.gelu(gate, approximate=...) * up``; their backwards are the ones
autograd would run for those expressions, op for op, so a patched model with no override serving
these ops computes the unpatched model's gradients bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from python_native.foundations import custom_ops, module_scope, public_names

Tensor = torch.Tensor

APPROXIMATIONS = ("none", "tanh")


def check_arguments(name: str, gate: Tensor, up: Tensor, approximate: str = "none") -> None:
    """``ValueError`` naming what the op cannot take (metadata only: FakeTensor safe)."""
    if gate.shape != up.shape:
        raise ValueError(f"{name}: gate and up must have one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    if not gate.is_floating_point() or not up.is_floating_point():
        raise ValueError(f"{name}: gate and up must be floating point, got {gate.dtype} and {up.dtype}")
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"{name}: approximate={approximate!r}; allowed: {list(APPROXIMATIONS)}")


def _fake(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    check_arguments("gated activation", gate, up, approximate)
    return torch.empty_like(gate, dtype=torch.promote_types(gate.dtype, up.dtype))


def _fake_backward(grad_output: Tensor, gate: Tensor, up: Tensor, approximate: str = "none") -> tuple[Tensor, Tensor]:
    check_arguments("gated activation backward", gate, up, approximate)
    return torch.empty_like(gate), torch.empty_like(up)


def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    check_arguments("swiglu", gate, up)
    return F.silu(gate) * up


def _swiglu_backward(grad_output: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    check_arguments("swiglu_backward", gate, up)
    with torch.no_grad():
        grad_gate = torch.ops.aten.silu_backward(grad_output * up, gate)
        return grad_gate.to(gate.dtype), (grad_output * F.silu(gate)).to(up.dtype)


def _geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    check_arguments("geglu", gate, up, approximate)
    return F.gelu(gate, approximate=approximate) * up


def _geglu_backward(grad_output: Tensor, gate: Tensor, up: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    check_arguments("geglu_backward", gate, up, approximate)
    with torch.no_grad():
        grad_gate = torch.ops.aten.gelu_backward(grad_output * up, gate, approximate=approximate)
        return grad_gate.to(gate.dtype), (grad_output * F.gelu(gate, approximate=approximate)).to(up.dtype)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.options = tuple(inputs[2:])  # geglu's approximation; nothing for swiglu
    ctx.module = module_scope.current()


def _autograd(backward_op):
    """The autograd formula of a gated op: its declared backward, in the forward's module."""

    def backward(ctx, grad_output):
        gate, up = ctx.saved_tensors
        with module_scope.inside(ctx.module):
            grad_gate, grad_up = backward_op(grad_output, gate, up, *ctx.options)
        needs = ctx.needs_input_grad
        return (grad_gate if needs[0] else None, grad_up if needs[1] else None, *(None for _ in ctx.options))

    return backward


SWIGLU_BACKWARD = custom_ops.declare(
    "swiglu_backward(Tensor grad_output, Tensor gate, Tensor up) -> (Tensor, Tensor)",
    reference=_swiglu_backward, fake=_fake_backward, doc="(grad_gate, grad_up) of swiglu")
SWIGLU = custom_ops.declare("swiglu(Tensor gate, Tensor up) -> Tensor", reference=_swiglu, fake=_fake,
                          backward=_autograd(SWIGLU_BACKWARD), setup_context=_setup_context,
                          doc="F.silu(gate) * up")
GEGLU_BACKWARD = custom_ops.declare(
    "geglu_backward(Tensor grad_output, Tensor gate, Tensor up, str approximate) -> (Tensor, Tensor)",
    reference=_geglu_backward, fake=_fake_backward, doc="(grad_gate, grad_up) of geglu")
GEGLU = custom_ops.declare("geglu(Tensor gate, Tensor up, str approximate='none') -> Tensor", reference=_geglu,
                         fake=_fake, backward=_autograd(GEGLU_BACKWARD), setup_context=_setup_context,
                         doc="F.gelu(gate, approximate=approximate) * up")
for _name in ("swiglu", "geglu"):
    public_names.declare(_name, _name)
    public_names.declare(_name, f"{_name}_backward", backward=True)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """``F.silu(gate) * up`` through ``torch.ops.python_native.swiglu`` (overrides serve it where installed)."""
    return SWIGLU(gate, up)


def geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """``F.gelu(gate, approximate=approximate) * up`` through ``torch.ops.python_native.geglu``."""
    return GEGLU(gate, up, approximate)


_sharding_registered = False


def register_dtensor_sharding() -> None:
    """DTensor's placements for the gated ops, registered on first use with DTensor inputs (importing
    DTensor costs more than these ops): the product is elementwise, so gate, up, the result and both
    gradients take one placement alike (replicated, or sharded on any dim); DTensor redistributes
    inputs placed otherwise, then each rank's override computes its local piece."""
    global _sharding_registered
    if _sharding_registered:
        return
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    def placements(gate):
        return [Replicate(), *(Shard(d) for d in range(gate.ndim))]

    def forward(gate, up, *options):
        return [([p], [p, p, *(None for _ in options)]) for p in placements(gate)]

    def backward(grad_output, gate, up, *options):
        return [([p, p], [p, p, p, *(None for _ in options)]) for p in placements(gate)]

    register_sharding([SWIGLU, GEGLU])(forward)
    register_sharding([SWIGLU_BACKWARD, GEGLU_BACKWARD])(backward)
    _sharding_registered = True
