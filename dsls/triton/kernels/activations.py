"""Pointwise activations (SiLU, GELU exact and tanh, quick-GELU), alone or gating a second operand,
forward and backward, computed in fp32.

Two launch shapes. Dense operands that share one layout are processed as flat arrays, in large
blocks so each thread moves several vectors per load. Row views (the rows at any stride: the
halves of ``gate_up.chunk(2, -1)``, a slice of a wider buffer, an expanded gradient) are
processed as tiles of rows and column blocks, each operand with its own row and column strides
(a column stride of 1 is specialized on, so contiguous rows load as vectors); their outputs are
contiguous. The gated kernels (SwiGLU, GeGLU) are the row kernels with ``GATED``:
``act(x) * u`` and its two gradients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..plans.elementwise import ElementwisePlan, RowsPlan
from ..plans.tiles import ELEMENTWISE_BLOCK, ELEMENTWISE_WARPS
from .alloc import new_contiguous
from .launch import Launcher, cast_out

SILU = 0
GELU = 1
GELU_TANH = 2
QUICK_GELU = 3

_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)
_SQRT_2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_TANH_COEF = tl.constexpr(0.044715)
_QUICK_COEF = tl.constexpr(1.702)
# The constants multiply tensors from the right: the interpreter mishandles constexpr * tensor.


@triton.jit
def _tanh(u):
    # Portable across backends and the interpreter; exact to fp32 rounding for small |u|.
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(u < 0, -t, t)


@triton.jit
def act_value(x, ACT: tl.constexpr):
    """``act(x)`` for an fp32 ``x``."""
    if ACT == 0:
        y = x / (1.0 + tl.exp(-x))
    elif ACT == 1:
        y = 0.5 * x * (1.0 + tl.erf(x * _SQRT1_2))
    elif ACT == 2:
        y = 0.5 * x * (1.0 + _tanh((x + x * x * x * _TANH_COEF) * _SQRT_2_PI))
    else:
        y = x / (1.0 + tl.exp(-(x * _QUICK_COEF)))
    return y


@triton.jit
def act_slope(x, ACT: tl.constexpr):
    """``act'(x)`` for an fp32 ``x``."""
    if ACT == 0:
        s = 1.0 / (1.0 + tl.exp(-x))
        d = s * (1.0 + x * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(x * _SQRT1_2))
        d = cdf + x * _INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    elif ACT == 2:
        x2 = x * x
        t = _tanh((x + x2 * x * _TANH_COEF) * _SQRT_2_PI)
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_PI * (1.0 + x2 * _TANH_COEF * 3.0)
    else:
        s = 1.0 / (1.0 + tl.exp(-(x * _QUICK_COEF)))
        d = s + x * s * (1.0 - s) * _QUICK_COEF
    return d


@triton.jit
def _act_fwd_kernel(X, Y, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + offs, cast_out(act_value(x, ACT), Y.dtype.element_ty), mask=ok)


@triton.jit
def _act_bwd_kernel(DY, X, DX, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(DX + offs, cast_out(dy * act_slope(x, ACT), DX.dtype.element_ty), mask=ok)


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row indices (int64, for strided addressing), column indices and the mask of this program's tile."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows.to(tl.int64)[:, None], cols[None, :], mask


@triton.jit
def _rows_fwd_kernel(
    X, U, Y, n_rows, n_cols, stride_xm, stride_xn, stride_um, stride_un,
    ACT: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    x = tl.load(X + rows * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
    y = act_value(x, ACT)
    if GATED:
        y = y * tl.load(U + rows * stride_um + cols * stride_un, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + rows * n_cols + cols, cast_out(y, Y.dtype.element_ty), mask=mask)


@triton.jit
def _rows_bwd_kernel(
    DY, X, U, DX, DU, n_rows, n_cols, stride_dym, stride_dyn, stride_xm, stride_xn, stride_um, stride_un,
    ACT: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    dy = tl.load(DY + rows * stride_dym + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + rows * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        u = tl.load(U + rows * stride_um + cols * stride_un, mask=mask, other=0.0).to(tl.float32)
        tl.store(DU + rows * n_cols + cols, cast_out(dy * act_value(x, ACT), DU.dtype.element_ty), mask=mask)
        dy = dy * u
    tl.store(DX + rows * n_cols + cols, cast_out(dy * act_slope(x, ACT), DX.dtype.element_ty), mask=mask)


_OPS = "silu, gelu, gelu_tanh, quick_gelu, swiglu, geglu"
_FWD = Launcher(_act_fwd_kernel, ("ACT", "BLOCK"), fresh=("Y",), op=_OPS)
_BWD = Launcher(_act_bwd_kernel, ("ACT", "BLOCK"), fresh=("DX",), op=_OPS + " (backward)")
_ROWS_FWD = Launcher(_rows_fwd_kernel, ("ACT", "GATED", "BLOCK_M", "BLOCK_N"), fresh=("Y",), op=_OPS)
_ROWS_BWD = Launcher(_rows_bwd_kernel, ("ACT", "GATED", "BLOCK_M", "BLOCK_N"), fresh=("DX", "DU"),
                     op=_OPS + " (backward)")


def _rows_out(x: torch.Tensor) -> torch.Tensor:
    return new_contiguous(x, tuple(x.shape), x.dtype)


def run_forward(x: torch.Tensor, plan: ElementwisePlan | RowsPlan, up: torch.Tensor | None = None) -> torch.Tensor:
    """``act(x)`` (times ``up`` for a gated plan) along a plan from ``plans.elementwise``: a flat
    plan writes a tensor with ``x``'s shape and strides, a row plan a contiguous one."""
    if plan.__class__ is ElementwisePlan:
        y = torch.empty_like(x)
        _FWD.planned(plan.launch_key, plan.grid, (x, y, plan.n), ELEMENTWISE_WARPS, plan.act, ELEMENTWISE_BLOCK)
        return y
    y = _rows_out(x)
    strides = plan.strides if plan.gated else (*plan.strides, 0, 0)
    _ROWS_FWD.planned(
        plan.launch_key, plan.grid, (x, x if up is None else up, y, plan.n_rows, plan.n_cols, *strides),
        plan.num_warps, plan.act, plan.gated, plan.block_m, plan.block_n,
    )
    return y


def run_backward(
    dy: torch.Tensor, x: torch.Tensor, plan: ElementwisePlan | RowsPlan, up: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``dy * act'(x)``; a gated plan returns ``(dy * up * act'(x), dy * act(x))``. A row plan's
    strides are ``(x's row and column strides, [up's,] dy's)``."""
    if plan.__class__ is ElementwisePlan:
        dx = torch.empty_like(x)
        _BWD.planned(plan.launch_key, plan.grid, (dy, x, dx, plan.n), ELEMENTWISE_WARPS, plan.act, ELEMENTWISE_BLOCK)
        return dx
    dx = _rows_out(x)
    du = _rows_out(up) if plan.gated else dx
    strides = plan.strides
    x_strides, u_strides = strides[:2], (strides[2:4] if plan.gated else (0, 0))
    _ROWS_BWD.planned(
        plan.launch_key, plan.grid,
        (dy, x, x if up is None else up, dx, du, plan.n_rows, plan.n_cols, *strides[-2:], *x_strides, *u_strides),
        plan.num_warps, plan.act, plan.gated, plan.block_m, plan.block_n,
    )
    return (dx, du) if plan.gated else dx
