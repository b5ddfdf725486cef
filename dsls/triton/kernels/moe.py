"""Mixture-of-experts kernels: the router's top-k, and the experts as grouped GEMMs over tokens sorted by expert.

The experts' (token, slot) pairs are sorted by expert (a stable sort) and their hidden states
gathered once; a *schedule* of row blocks, each inside one expert's rows, drives every grouped
kernel (one program per block and column tile, so an expert given no token costs nothing):

- ``_gate_up_kernel``: the gate and up columns of one tile in two accumulators, the gated
  activation fused (forward: its value; backward: the gradients of gate and up from the
  activation's, the gate/up GEMM recomputed);
- ``_grouped_kernel``: ``A[rows] @ B[expert]`` with an optional bias and per-row scale (the down
  projection weighted by the routing weight; the backward's products with the weights);
- ``_expert_outer_kernel``: ``A[rows]^T @ B[rows]`` over each expert's rows, in a fixed order: the
  weight gradients (and, against a column of ones, the bias gradients) without atomics.

Each token's rows are summed in top-k order by the host, so results do not depend on scheduling.
Accumulation is in fp32 (``ieee`` products for fp32 operands).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..target import interpret_mode
from .activations import act_slope, act_value
from .launch import Launcher, cast_out

CLAMPED = tl.constexpr(3)  # the activation code of GPT-OSS's clamped SwiGLU (0-2: act_value's silu, gelu, gelu tanh)


@triton.jit
def _in_best_groups(choice, cols, ok, group_size, n_group, topk_group, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr):
    """``choice`` outside the ``topk_group`` best of ``n_group`` groups set to -inf (a group's score:
    the sum of its two best choices; ties go to the lower group, as to the lower expert below)."""
    groups = tl.arange(0, BLOCK_G)
    member = (groups[:, None] == (cols // group_size)[None, :]) & ok[None, :]  # (groups, experts)
    c = tl.where(member, choice[None, :], -float("inf"))
    best = tl.max(c, 1)
    first = tl.min(tl.where(member & (c == best[:, None]), cols[None, :], BLOCK_E), 1)
    score = best + tl.max(tl.where(cols[None, :] == first[:, None], -float("inf"), c), 1)  # padding groups: -inf
    ahead = (score[None, :] > score[:, None]) | ((score[None, :] == score[:, None]) & (groups[None, :] < groups[:, None]))
    chosen = (tl.sum(ahead.to(tl.int32), 1) < topk_group) & (groups < n_group)
    return tl.where(tl.max((member & chosen[:, None]).to(tl.int32), 0) > 0, choice, -float("inf"))


@triton.jit
def _route_kernel(
    LOGITS, BIAS, W_OUT, I_OUT, n_experts, stride_l, eps, scaling, n_group, topk_group,
    SIGMOID: tl.constexpr, TOPK_FIRST: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    ok = cols < n_experts
    x = tl.load(LOGITS + row * stride_l + cols, mask=ok, other=-float("inf")).to(tl.float32)
    if TOPK_FIRST:
        scores = x
    elif SIGMOID:
        scores = tl.sigmoid(x)
    else:
        e = tl.exp(x - tl.max(x, 0))
        scores = e / tl.sum(e, 0)
    choice = tl.where(ok, scores, -float("inf"))
    if HAS_BIAS:
        choice += tl.load(BIAS + cols, mask=ok, other=0.0).to(tl.float32)
    if BLOCK_G > 1:
        choice = _in_best_groups(choice, cols, ok, n_experts // n_group, n_group, topk_group, BLOCK_E, BLOCK_G)
    slots = tl.arange(0, BLOCK_K)
    values = tl.zeros([BLOCK_K], dtype=tl.float32)
    picked = tl.zeros([BLOCK_K], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        best = tl.max(choice, 0)
        at = tl.min(tl.where(choice == best, cols, BLOCK_E), 0)
        values = tl.where(slots == k, tl.sum(tl.where(cols == at, scores, 0.0), 0), values)
        picked = tl.where(slots == k, at.to(tl.int64), picked)
        choice = tl.where(cols == at, -float("inf"), choice)
    kept = slots < TOP_K
    if TOPK_FIRST:
        e = tl.where(kept, tl.exp(values - tl.max(tl.where(kept, values, -float("inf")), 0)), 0.0)
        values = e / tl.sum(e, 0)
    if RENORM:
        values = values / (tl.sum(tl.where(kept, values, 0.0), 0) + eps)
    values = values * scaling
    tl.store(W_OUT + row * TOP_K + slots, cast_out(values, W_OUT.dtype.element_ty), mask=kept)
    tl.store(I_OUT + row * TOP_K + slots, picked, mask=kept)


@triton.jit
def _route_backward_kernel(
    GRAD_W, LOGITS, INDICES, GRAD_L, n_experts, stride_l, eps, scaling,
    SIGMOID: tl.constexpr, TOPK_FIRST: tl.constexpr, RENORM: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    ok = cols < n_experts
    slots = tl.arange(0, BLOCK_K)
    kept = slots < TOP_K
    x = tl.load(LOGITS + row * stride_l + cols, mask=ok, other=-float("inf")).to(tl.float32)
    at = tl.load(INDICES + row * TOP_K + slots, mask=kept, other=-1)
    g = tl.load(GRAD_W + row * TOP_K + slots, mask=kept, other=0.0).to(tl.float32) * scaling
    hit = (cols[:, None] == at[None, :]) & kept[None, :]  # (experts, slots)
    if TOPK_FIRST:
        v = tl.sum(tl.where(hit, x[:, None], 0.0), 0)
        e = tl.where(kept, tl.exp(v - tl.max(tl.where(kept, v, -float("inf")), 0)), 0.0)
        w = e / tl.sum(e, 0)
        g = w * (g - tl.sum(g * w, 0))
        grad = tl.sum(tl.where(hit, g[None, :], 0.0), 1)
    else:
        if SIGMOID:
            scores = tl.sigmoid(x)
        else:
            ex = tl.exp(x - tl.max(x, 0))
            scores = ex / tl.sum(ex, 0)
        v = tl.sum(tl.where(hit, scores[:, None], 0.0), 0)
        if RENORM:
            total = tl.sum(v, 0) + eps
            g = g / total - tl.sum(g * v, 0) / (total * total)
        gs = tl.sum(tl.where(hit, g[None, :], 0.0), 1)
        if SIGMOID:
            grad = gs * scores * (1.0 - scores)
        else:
            grad = scores * (gs - tl.sum(tl.where(ok, gs * scores, 0.0), 0))
    tl.store(GRAD_L + row * n_experts + cols, cast_out(grad, GRAD_L.dtype.element_ty), mask=ok)


@triton.jit
def _r(x, DT: tl.constexpr):
    """``x`` rounded to ``DT`` and back: the rounding the modules' own half-precision steps make."""
    return cast_out(x, DT).to(tl.float32)


@triton.jit
def _gated(g, u, ACT: tl.constexpr, limit, alpha, DT: tl.constexpr):
    """The activation, rounded where the module's torch ops round (gate and up already rounded)."""
    if ACT == CLAMPED:
        gc = tl.minimum(g, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        y = _r(uc + 1.0, DT) * _r(gc * _r(tl.sigmoid(_r(gc * alpha, DT)), DT), DT)
    else:
        y = _r(act_value(g, ACT), DT) * u
    return y


@triton.jit
def _gated_grad(dh, g, u, ACT: tl.constexpr, limit, alpha):
    if ACT == CLAMPED:
        gc = tl.minimum(g, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        s = tl.sigmoid(gc * alpha)
        du = tl.where((u >= -limit) & (u <= limit), dh * gc * s, 0.0)
        dg = tl.where(g <= limit, dh * (uc + 1.0) * (s + gc * alpha * s * (1.0 - s)), 0.0)
    else:
        du = dh * act_value(g, ACT)
        dg = dh * u * act_slope(g, ACT)
    return dg, du


@triton.jit
def _block(BLK_E, BLK_START, BLK_END, n, BM: tl.constexpr, BN: tl.constexpr):
    """This program's expert, rows (and their mask) and columns (and theirs)."""
    pid = tl.program_id(0)
    e = tl.load(BLK_E + pid).to(tl.int64)
    start = tl.load(BLK_START + pid)
    rows = start + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    return e, rows.to(tl.int64), rows < tl.load(BLK_END + pid), cols, cols < n


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


@triton.jit
def _gate_up_kernel(
    X, W, BIAS, DH, H_OUT, DGU, BLK_E, BLK_START, BLK_END, inner, size, sw_e, sw_k, sw_n, sb_e,
    col_step, up_offset, limit, alpha,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BACKWARD: tl.constexpr, IEEE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    e, rows, row_ok, cols, col_ok = _block(BLK_E, BLK_START, BLK_END, inner, BM, BN)
    gate_cols = cols * col_step
    up_cols = gate_cols + up_offset
    g = tl.zeros([BM, BN], dtype=tl.float32)
    u = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, size, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < size
        x = tl.load(X + rows[:, None] * size + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_at = W + e * sw_e + ks[:, None] * sw_k
        w_ok = k_ok[:, None] & col_ok[None, :]
        g += _dot(x, tl.load(w_at + gate_cols[None, :] * sw_n, mask=w_ok, other=0.0), IEEE)
        u += _dot(x, tl.load(w_at + up_cols[None, :] * sw_n, mask=w_ok, other=0.0), IEEE)
    DT: tl.constexpr = X.dtype.element_ty
    g, u = _r(g, DT), _r(u, DT)
    if HAS_BIAS:
        g = _r(g + tl.load(BIAS + e * sb_e + gate_cols, mask=col_ok, other=0.0).to(tl.float32)[None, :], DT)
        u = _r(u + tl.load(BIAS + e * sb_e + up_cols, mask=col_ok, other=0.0).to(tl.float32)[None, :], DT)
    mask = row_ok[:, None] & col_ok[None, :]
    if BACKWARD:
        dh = tl.load(DH + rows[:, None] * inner + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dg, du = _gated_grad(dh, g, u, ACT, limit, alpha)
        at = DGU + rows[:, None] * (2 * inner)
        tl.store(at + gate_cols[None, :], cast_out(dg, DGU.dtype.element_ty), mask=mask)
        tl.store(at + up_cols[None, :], cast_out(du, DGU.dtype.element_ty), mask=mask)
    else:
        h = _gated(g, u, ACT, limit, alpha, DT)
        tl.store(H_OUT + rows[:, None] * inner + cols[None, :], cast_out(h, H_OUT.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_kernel(
    A, B, BIAS, SCALE, C, BLK_E, BLK_START, BLK_END, n, k, sb_e, sb_k, sb_n, sbias_e,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, IEEE: tl.constexpr, ROUND: tl.constexpr, ROUND_DT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    e, rows, row_ok, cols, col_ok = _block(BLK_E, BLK_START, BLK_END, n, BM, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, k, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < k
        a = tl.load(A + rows[:, None] * k + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(B + e * sb_e + ks[:, None] * sb_k + cols[None, :] * sb_n, mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)
        acc += _dot(a, b, IEEE)
    if ROUND:  # the module's rounding: the product, the bias added, then the weighting
        acc = _r(acc, A.dtype.element_ty)
    if HAS_BIAS:
        acc += tl.load(BIAS + e * sbias_e + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if ROUND:
            acc = _r(acc, A.dtype.element_ty)
    if HAS_SCALE:
        acc *= tl.load(SCALE + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        if ROUND:
            acc = _r(acc, ROUND_DT)
    tl.store(C + rows[:, None] * n + cols[None, :], cast_out(acc, C.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _expert_outer_kernel(
    A, B, D, STARTS, COUNTS, p, q, sb_m, sd_e, sd_p, sd_q,
    IEEE: tl.constexpr, BP: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr,
):
    e = tl.program_id(0).to(tl.int64)
    ps = tl.program_id(1) * BP + tl.arange(0, BP)
    qs = tl.program_id(2) * BQ + tl.arange(0, BQ)
    start = tl.load(STARTS + e)
    count = tl.load(COUNTS + e)
    acc = tl.zeros([BP, BQ], dtype=tl.float32)
    for r0 in range(0, count, BR):
        rs = r0 + tl.arange(0, BR)
        r_ok = rs < count
        rows = (start + rs).to(tl.int64)
        a = tl.load(A + rows[None, :] * p + ps[:, None], mask=r_ok[None, :] & (ps < p)[:, None], other=0.0)
        b = tl.load(B + rows[:, None] * sb_m + qs[None, :], mask=r_ok[:, None] & (qs < q)[None, :], other=0.0)
        acc += _dot(a, b, IEEE)
    tl.store(D + e * sd_e + ps[:, None] * sd_p + qs[None, :] * sd_q, cast_out(acc, D.dtype.element_ty),
             mask=(ps < p)[:, None] & (qs < q)[None, :])


ROUTE = Launcher(_route_kernel, ("SIGMOID", "TOPK_FIRST", "RENORM", "HAS_BIAS", "TOP_K", "BLOCK_E", "BLOCK_K",
                                 "BLOCK_G"), fresh=("W_OUT", "I_OUT"), op="moe_route")
ROUTE_BACKWARD = Launcher(_route_backward_kernel, ("SIGMOID", "TOPK_FIRST", "RENORM", "TOP_K", "BLOCK_E", "BLOCK_K"),
                          fresh=("GRAD_L",), op="moe_route_backward")
GATE_UP = Launcher(_gate_up_kernel, ("ACT", "HAS_BIAS", "BACKWARD", "IEEE", "BM", "BN", "BK"),
                   op="moe_experts, moe_experts_backward")
GROUPED = Launcher(_grouped_kernel, ("HAS_BIAS", "HAS_SCALE", "IEEE", "ROUND", "ROUND_DT", "BM", "BN", "BK"),
                   fresh=("C",), op="moe_experts, moe_experts_backward")
OUTER = Launcher(_expert_outer_kernel, ("IEEE", "BP", "BQ", "BR"), fresh=("D",), op="moe_experts_backward")


# ---------------------------------------------------------------------------------------------
# Host side

ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "clamped_swiglu": CLAMPED.value}
BLOCK = 32  # rows, columns and depth of a grouped tile


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _ieee(w: torch.Tensor) -> bool:
    """fp32 products: for fp32 operands (no TF32), and under the interpreter, whose half-precision
    products accumulate in half precision."""
    return w.dtype == torch.float32 or interpret_mode()


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def route(logits: torch.Tensor, top_k: int, sigmoid: bool, topk_first: bool, renormalize: bool, eps: float,
          bias: torch.Tensor | None, scaling: float, out_dtype: torch.dtype, n_group: int = 1,
          topk_group: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, indices) of each row's ``top_k`` experts (within its ``topk_group`` best groups), best first."""
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=out_dtype, device=logits.device)
    indices = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        block_g = 1 if n_group == 1 else triton.next_power_of_2(n_group)
        ROUTE((tokens,), (logits, logits if bias is None else bias, weights, indices, experts, logits.stride(0),
                          float(eps if renormalize else 0.0), float(scaling), n_group, topk_group),
              4, sigmoid, topk_first, renormalize, bias is not None, top_k, _pow2(experts), _pow2(top_k), block_g)
    return weights, indices


def route_backward(grad_weights: torch.Tensor, logits: torch.Tensor, indices: torch.Tensor, sigmoid: bool,
                   topk_first: bool, renormalize: bool, eps: float, scaling: float) -> torch.Tensor:
    tokens, experts = logits.shape
    top_k = indices.shape[1]
    grad = torch.empty(tokens, experts, dtype=logits.dtype, device=logits.device)
    if tokens:
        ROUTE_BACKWARD((tokens,), (grad_weights.contiguous(), logits, indices.contiguous(), grad, experts,
                                   logits.stride(0), float(eps if renormalize else 0.0), float(scaling)),
                       4, sigmoid, topk_first, renormalize, top_k, _pow2(experts), _pow2(top_k))
    return grad


class Sorted:
    """The (token, slot) pairs sorted by expert, and the schedule of row blocks over them."""

    def __init__(self, indices: torch.Tensor, experts: int):
        flat = indices.reshape(-1)
        self.top_k = indices.shape[1]
        self.order = torch.argsort(flat, stable=True)
        self.token = self.order // self.top_k
        lo, hi = torch.stack(flat.aminmax()).tolist()
        if lo < 0 or hi >= experts:
            raise ValueError(f"moe_experts: expert indices must lie in [0, {experts}), got values from {lo} to {hi}")
        counts = torch.bincount(flat, minlength=experts)
        self.starts = (torch.cumsum(counts, 0) - counts).to(torch.int32)
        self.counts = counts.to(torch.int32)
        blocks = (counts + BLOCK - 1) // BLOCK
        self.n_blocks = int(blocks.sum())
        expert = torch.repeat_interleave(torch.arange(experts, device=flat.device), blocks)
        first = torch.repeat_interleave(torch.cumsum(blocks, 0) - blocks, blocks)
        within = torch.arange(self.n_blocks, device=flat.device) - first
        self.block_expert = expert.to(torch.int32)
        self.block_start = (self.starts.long()[expert] + within * BLOCK).to(torch.int32)
        self.block_end = (self.starts.long() + counts)[expert].to(torch.int32)

    def schedule(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.block_expert, self.block_start, self.block_end

    def to_tokens(self, rows: torch.Tensor) -> torch.Tensor:
        """Sorted rows back to (token, slot) order, summed per token over its slots in slot order."""
        out = torch.empty_like(rows)
        out[self.order] = rows
        return out.view(-1, self.top_k, rows.shape[1]).sum(dim=1)


def _matrix(w: torch.Tensor, transposed: bool) -> tuple[int, int, int]:
    """(expert, k, n) strides of ``w`` read as ``x @ w[e]`` matrices (``F.linear``'s layout unless transposed)."""
    return (w.stride(0), w.stride(1), w.stride(2)) if transposed else (w.stride(0), w.stride(2), w.stride(1))


def grouped(a: torch.Tensor, b: torch.Tensor, strides: tuple[int, int, int], n: int, s: Sorted,
            bias: torch.Tensor | None = None, scale: torch.Tensor | None = None,
            dtype: torch.dtype | None = None, rounded: torch.dtype | None = None) -> torch.Tensor:
    """``a[rows] @ b[expert]`` (+ bias, * scale per row) for every expert's rows; ``rounded``: each step
    rounded as the module's ops round (to ``a``'s dtype, the weighted rows to ``rounded``)."""
    c = torch.empty(a.shape[0], n, dtype=dtype or a.dtype, device=a.device)
    if s.n_blocks:
        GROUPED((s.n_blocks, triton.cdiv(n, BLOCK)), (a, b, a if bias is None else bias, a if scale is None else scale,
                                                      c, *s.schedule(), n, a.shape[1], *strides,
                                                      0 if bias is None else bias.stride(0)),
                4, bias is not None, scale is not None, _ieee(b), rounded is not None,
                _TL_DTYPES[rounded or torch.float32], BLOCK, BLOCK, BLOCK)
    return c


def gate_up(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, s: Sorted, options: tuple,
            grad_h: torch.Tensor | None = None) -> torch.Tensor:
    """The gated activation of ``x @ gate_up[expert]`` (with ``grad_h``: the gradient of gate_up's output)."""
    activation, transposed, interleaved, limit, alpha = options
    inner = (w.shape[2] if transposed else w.shape[1]) // 2
    backward = grad_h is not None
    out = torch.empty(x.shape[0], 2 * inner if backward else inner, dtype=x.dtype, device=x.device)
    if s.n_blocks:
        GATE_UP((s.n_blocks, triton.cdiv(inner, BLOCK)),
                (x, w, x if bias is None else bias, out if grad_h is None else grad_h, out, out, *s.schedule(),
                 inner, x.shape[1], *_matrix(w, transposed), 0 if bias is None else bias.stride(0),
                 2 if interleaved else 1, 1 if interleaved else inner, float(limit), float(alpha)),
                4, ACT_CODES[activation], bias is not None, backward, _ieee(w), BLOCK, BLOCK, BLOCK)
    return out


def outer(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, d_strides: tuple[int, int, int], s: Sorted) -> None:
    """``d[e] = a[rows of e]^T @ b[rows of e]`` for every expert (zero where it has no rows)."""
    p, q = a.shape[1], b.shape[1]
    OUTER((d.shape[0], triton.cdiv(p, BLOCK), triton.cdiv(q, BLOCK)),
          (a, b, d, s.starts, s.counts, p, q, b.stride(0), *d_strides), 4, _ieee(a),
          BLOCK, BLOCK, BLOCK)
