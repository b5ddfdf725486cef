"""Elementwise SiLU and GELU (exact and tanh), forward and backward, computed in fp32.

Inputs are processed as flat arrays (the op layer only accepts dense layouts shared by every
operand), in large blocks so each thread moves several vectors per load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.elementwise import ElementwisePlan
from ..plans.tiles import ELEMENTWISE_BLOCK, ELEMENTWISE_WARPS
from .launch import Launcher, cast_out

SILU = 0
GELU = 1
GELU_TANH = 2

_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)
_SQRT_2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_TANH_COEF = tl.constexpr(0.044715)
# The constants multiply tensors from the right: the interpreter mishandles constexpr * tensor.


@triton.jit
def _tanh(u):
    # Portable across backends and the interpreter; exact to fp32 rounding for small |u|.
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(u < 0, -t, t)


@triton.jit
def _act_fwd_kernel(X, Y, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    if ACT == 0:
        y = x / (1.0 + tl.exp(-x))
    elif ACT == 1:
        y = 0.5 * x * (1.0 + tl.erf(x * _SQRT1_2))
    else:
        y = 0.5 * x * (1.0 + _tanh((x + x * x * x * _TANH_COEF) * _SQRT_2_PI))
    tl.store(Y + offs, cast_out(y, Y.dtype.element_ty), mask=ok)


@triton.jit
def _act_bwd_kernel(DY, X, DX, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
    if ACT == 0:
        s = 1.0 / (1.0 + tl.exp(-x))
        d = s * (1.0 + x * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(x * _SQRT1_2))
        d = cdf + x * _INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    else:
        x2 = x * x
        t = _tanh((x + x2 * x * _TANH_COEF) * _SQRT_2_PI)
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_PI * (1.0 + x2 * _TANH_COEF * 3.0)
    tl.store(DX + offs, cast_out(dy * d, DX.dtype.element_ty), mask=ok)


_FWD = Launcher(_act_fwd_kernel, ("ACT", "BLOCK"), fresh=("Y",), op="silu, gelu")
_BWD = Launcher(_act_bwd_kernel, ("ACT", "BLOCK"), fresh=("DX",), op="silu_backward, gelu_backward")


def run_forward(x: torch.Tensor, plan: ElementwisePlan) -> torch.Tensor:
    """``act(x)`` into a tensor with ``x``'s shape and strides (``x`` must be dense), along a plan
    from ``ops.activations``."""
    y = torch.empty_like(x)
    _FWD.planned(plan.launch_key, plan.grid, (x, y, plan.n), ELEMENTWISE_WARPS, plan.act, ELEMENTWISE_BLOCK)
    return y


def run_backward(dy: torch.Tensor, x: torch.Tensor, plan: ElementwisePlan) -> torch.Tensor:
    """``dy * act'(x)``; ``dy`` and ``x`` must be dense with identical strides."""
    dx = torch.empty_like(x)
    _BWD.planned(plan.launch_key, plan.grid, (dy, x, dx, plan.n), ELEMENTWISE_WARPS, plan.act, ELEMENTWISE_BLOCK)
    return dx
