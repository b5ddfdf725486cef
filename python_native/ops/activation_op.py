"""``python_native::gelu_tanh`` and ``python_native::quick_gelu``: activations models write by hand.

GPT-2-style models compute the tanh approximation of GELU as a chain of pointwise ops in Python
(``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``), CLIP-style ones QuickGELU
(``x * sigmoid(1.702 * x)``): each op is a kernel of its own and keeps its own intermediate for
the backward, and no aten op is there for an override to take. These ops are those expressions
as one call; their references compute the expressions op for op, as the modules do, and their
backwards compute the derivative in fp32 (or the input's dtype where wider).
"""

from __future__ import annotations

import math

import torch

from python_native.foundations import custom_ops, module_scope, public_names

Tensor = torch.Tensor

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715
QUICK = 1.702


def _check(name: str, x: Tensor) -> None:
    if not x.is_floating_point():
        raise ValueError(f"{name}: x must be floating point, got {x.dtype}")


def _wide(x: Tensor) -> Tensor:
    """``x`` in the dtype the backward computes in: fp32, or fp64 for fp64 inputs."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _gelu_tanh(x: Tensor) -> Tensor:
    _check("gelu_tanh", x)
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + CUBIC * torch.pow(x, 3.0))))


def _gelu_tanh_backward(grad_output: Tensor, x: Tensor) -> Tensor:
    _check("gelu_tanh_backward", x)
    with torch.no_grad():
        w = _wide(x)
        t = torch.tanh(SQRT_2_OVER_PI * (w + CUBIC * w * w * w))
        slope = 0.5 * (1.0 + t) + 0.5 * w * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * w * w)
        return (_wide(grad_output) * slope).to(x.dtype)


def _quick_gelu(x: Tensor) -> Tensor:
    _check("quick_gelu", x)
    return x * torch.sigmoid(QUICK * x)


def _quick_gelu_backward(grad_output: Tensor, x: Tensor) -> Tensor:
    _check("quick_gelu_backward", x)
    with torch.no_grad():
        w = _wide(x)
        s = torch.sigmoid(QUICK * w)
        return (_wide(grad_output) * (s + QUICK * w * s * (1.0 - s))).to(x.dtype)


def _fake(x: Tensor) -> Tensor:
    _check("activation", x)
    return torch.empty_like(x)


def _fake_backward(grad_output: Tensor, x: Tensor) -> Tensor:
    _check("activation backward", x)
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.module = module_scope.current()


def _autograd(backward_op):
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        with module_scope.inside(ctx.module):
            return backward_op(grad_output, x)

    return backward


def _declare(name: str, reference, backward_reference, doc: str):
    backward = custom_ops.declare(f"{name}_backward(Tensor grad_output, Tensor x) -> Tensor",
                                reference=backward_reference, fake=_fake_backward, doc=f"gradient of {name}, in fp32")
    op = custom_ops.declare(f"{name}(Tensor x) -> Tensor", reference=reference, fake=_fake,
                          backward=_autograd(backward), setup_context=_setup_context, doc=doc)
    public_names.declare(name, name)
    public_names.declare(name, f"{name}_backward", backward=True)
    return op, backward


GELU_TANH, GELU_TANH_BACKWARD = _declare("gelu_tanh", _gelu_tanh, _gelu_tanh_backward,
                                         "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), as written by hand")
QUICK_GELU, QUICK_GELU_BACKWARD = _declare("quick_gelu", _quick_gelu, _quick_gelu_backward, "x * sigmoid(1.702 * x)")


def gelu_tanh(x: Tensor) -> Tensor:
    """The hand-written tanh-GELU of GPT-2-style models, through ``torch.ops.python_native.gelu_tanh``."""
    return GELU_TANH(x)


def quick_gelu(x: Tensor) -> Tensor:
    """``x * torch.sigmoid(1.702 * x)`` through ``torch.ops.python_native.quick_gelu``."""
    return QUICK_GELU(x)
