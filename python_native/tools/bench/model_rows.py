"""Benchmark rows of the ops model patching declares (``torch.ops.python_native.*``).

Each row calls the declared op: with the overrides on, the Triton kernels; with the DSL disabled
(the "aten" column), the op's reference, which is the plain-torch formula of the module the op
replaces, as an unpatched model runs it. Inductor compiles that formula (``FORMULAS``), not the
op. Shapes are those of LLM training steps: hidden 4096 rows, MLP intermediates of 11008 and
14336 columns (and the halves of a fused gate/up projection), q/k norms over a head dim of 128,
rotary embedding of 32 query and 8 key heads, GPT-2's MLP for the tanh-GELU formula. The MoE
rows route and run a small layer and Qwen3-30B-A3B's (hidden 2048, expert intermediate 768, 128
experts, top 8, 8192 tokens); they are GEMM-bound, so their figure of merit is time (``moe_flops``
gives the FLOPs a rate is taken from), and their bytes are the least any kernel must move.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

EPS = 1e-6
# op -> (quick shapes, full shapes); rotary's shape is (batch, seq, q heads, k heads, head dim).
SHAPES: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    "rms_norm_llama": ([(4, 64)], [(16384, 4096), (8192, 8192), (4096, 16384), (262144, 128)]),
    "rms_norm_gemma": ([(4, 64)], [(16384, 4096), (262144, 128)]),
    "swiglu": ([(4, 64)], [(8192, 11008), (4096, 14336)]),
    "swiglu_chunked": ([(4, 64)], [(8192, 11008), (4096, 14336)]),
    "geglu": ([(4, 64)], [(8192, 11008)]),
    "rotary": ([(1, 4, 2, 1, 16)], [(1, 4096, 32, 8, 128), (4, 4096, 32, 8, 128)]),
    "gelu_tanh_formula": ([(4, 64)], [(8192, 3072), (8192, 16384)]),
    "quick_gelu": ([(4, 64)], [(8192, 3072), (8192, 16384)]),
    # (tokens, experts, top k) and (tokens, hidden, expert intermediate, experts, top k)
    "moe_route": ([(8, 16, 4)], [(2048, 64, 8), (8192, 128, 8)]),
    "moe_experts": ([(8, 32, 16, 4, 2)], [(2048, 1024, 512, 16, 4), (8192, 2048, 768, 128, 8)]),
}
OPS = tuple(SHAPES)


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


def make_inputs(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
    """The row's tensors by name (``leaves``: those gradients are reset for; ``dy``: the gradient
    the output(s) receive)."""
    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype) * scale

    if op == "rotary":
        b, s, h, kv, d = shape
        q = _leaf(randn(b, s, h, d).transpose(1, 2), grad)  # as attention modules make them
        k = _leaf(randn(b, s, kv, d).transpose(1, 2), grad)
        angles = torch.arange(s, device=device)[:, None] * torch.rand(d // 2, device=device)
        cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype).expand(b, s, d) for f in (torch.cos, torch.sin))
        dy = (torch.randn_like(q), torch.randn_like(k)) if grad else None
        return {"q": q, "k": k, "cos": cos, "sin": sin, "leaves": [q, k] if grad else [], "dy": dy}
    if op.startswith("moe_"):
        return _moe_inputs(op, shape, randn, grad)
    m, n = shape
    if op.startswith("rms_norm"):
        x, w = _leaf(randn(m, n), grad), _leaf(randn(n, scale=0.1 if op == "rms_norm_gemma" else 1.0), grad)
        return {"x": x, "w": w, "leaves": [x, w] if grad else [], "dy": randn(m, n) if grad else None}
    if op in ("swiglu", "swiglu_chunked", "geglu"):
        if op == "swiglu_chunked":
            gate_up = _leaf(randn(m, 2 * n), grad)
            return {"gate_up": gate_up, "leaves": [gate_up] if grad else [], "dy": randn(m, n) if grad else None}
        gate, up = _leaf(randn(m, n), grad), _leaf(randn(m, n), grad)
        return {"gate": gate, "up": up, "leaves": [gate, up] if grad else [], "dy": randn(m, n) if grad else None}
    x = _leaf(randn(m, n, scale=3.0), grad)
    return {"x": x, "leaves": [x] if grad else [], "dy": randn(m, n) if grad else None}


def _moe_inputs(op: str, shape: tuple[int, ...], randn: Callable[..., torch.Tensor], grad: bool) -> dict:
    """Router logits, or a routed layer: tokens routed by softmax top-k of random logits (made here,
    not timed), experts in ``F.linear``'s layout at an initializer's scale."""
    if op == "moe_route":
        tokens, experts, k = shape
        logits = _leaf(randn(tokens, experts), grad)
        return {"logits": logits, "k": k, "leaves": [logits] if grad else [], "dy": randn(tokens, k) if grad else None}
    tokens, hidden, inner, experts, k = shape
    x = _leaf(randn(tokens, hidden), grad)
    with torch.no_grad():
        top = randn(tokens, experts).float().softmax(-1).topk(k)
    weights = _leaf((top.values / top.values.sum(-1, keepdim=True)).to(x.dtype), grad)
    gate_up = _leaf(randn(experts, 2 * inner, hidden, scale=hidden ** -0.5), grad)
    down = _leaf(randn(experts, hidden, inner, scale=inner ** -0.5), grad)
    leaves = [x, weights, gate_up, down] if grad else []
    return {"hidden": x, "indices": top.indices, "weights": weights, "gate_up": gate_up, "down": down,
            "leaves": leaves, "dy": randn(tokens, hidden) if grad else None}


def moe_flops(op: str, shape: tuple[int, ...], mode: str) -> int:
    """The GEMM FLOPs of a ``moe_experts`` row (two multiply-adds per weight per routed token: gate/up
    and down forward; the backward twice that again, inputs' and weights' gradients); 0 for others."""
    if op != "moe_experts":
        return 0
    tokens, hidden, inner, _, k = shape
    forward = 2 * tokens * k * 3 * inner * hidden
    return forward * (3 if mode == "fwd+bwd" else 1)


def _gate_up(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return t["gate_up"].chunk(2, -1) if "gate_up" in t else (t["gate"], t["up"])


def _ops():
    return torch.ops.python_native


FUNCTIONS: dict[str, Callable[[dict], object]] = {
    "rms_norm_llama": lambda t: _ops().rms_norm(t["x"], t["w"], EPS),
    "rms_norm_gemma": lambda t: _ops().rms_norm(t["x"], t["w"], EPS, 1.0, True),
    "swiglu": lambda t: _ops().swiglu(*_gate_up(t)),
    "swiglu_chunked": lambda t: _ops().swiglu(*_gate_up(t)),
    "geglu": lambda t: _ops().geglu(*_gate_up(t), "tanh"),
    "rotary": lambda t: _ops().rotary(t["q"], t["k"], t["cos"], t["sin"], 1),
    "gelu_tanh_formula": lambda t: _ops().gelu_tanh(t["x"]),
    "quick_gelu": lambda t: _ops().quick_gelu(t["x"]),
    "moe_route": lambda t: _ops().moe_route(t["logits"], t["k"], "softmax", False, True)[0],  # the weights
    "moe_experts": lambda t: _ops().moe_experts(t["hidden"], t["indices"], t["weights"], t["gate_up"], t["down"]),
}


def _rms_norm(x: torch.Tensor, w: torch.Tensor, offset: float, weight_in_fp32: bool) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    if weight_in_fp32:
        return (h * (offset + w.float())).to(x.dtype)
    return (w if offset == 0.0 else offset + w) * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _rotary(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = t["cos"].unsqueeze(1), t["sin"].unsqueeze(1)
    return t["q"] * cos + _rotate_half(t["q"]) * sin, t["k"] * cos + _rotate_half(t["k"]) * sin


FORMULAS: dict[str, Callable[[dict], object]] = {
    "rms_norm_llama": lambda t: _rms_norm(t["x"], t["w"], 0.0, False),
    "rms_norm_gemma": lambda t: _rms_norm(t["x"], t["w"], 1.0, True),
    "swiglu": lambda t: F.silu(_gate_up(t)[0]) * _gate_up(t)[1],
    "swiglu_chunked": lambda t: F.silu(_gate_up(t)[0]) * _gate_up(t)[1],
    "geglu": lambda t: F.gelu(_gate_up(t)[0], approximate="tanh") * _gate_up(t)[1],
    "rotary": _rotary,
    "gelu_tanh_formula": lambda t: 0.5 * t["x"] * (1.0 + torch.tanh(
        math.sqrt(2.0 / math.pi) * (t["x"] + 0.044715 * torch.pow(t["x"], 3.0)))),
    "quick_gelu": lambda t: t["x"] * torch.sigmoid(1.702 * t["x"]),
}


def bytes_moved(op: str, shape: tuple[int, ...], mode: str, itemsize: int) -> int:
    """What the op must move: every input read once, every output written once (forward; the
    backward reads the forward's inputs and the output gradients and writes the input gradients)."""
    backward = mode == "fwd+bwd"
    if op == "moe_route":  # logits, weights, int64 indices; backward dweights, logits, indices, dlogits
        tokens, experts, k = shape
        forward = tokens * (experts * itemsize + k * (itemsize + 8))
        return forward + (tokens * (2 * experts * itemsize + k * (itemsize + 8)) if backward else 0)
    if op == "moe_experts":  # the weights once, hidden and routing in, the output out (backward: twice, and dy)
        tokens, hidden, inner, experts, k = shape
        weights = 3 * experts * inner * hidden * itemsize
        acts = tokens * (2 * hidden * itemsize + k * (itemsize + 8))
        return 3 * weights + 2 * acts + tokens * hidden * itemsize if backward else weights + acts
    if op == "rotary":
        b, s, h, kv, d = shape
        heads = b * s * (h + kv) * d
        tables = 2 * b * s * d
        return itemsize * ((2 * heads + tables) * (2 if backward else 1))
    elements = math.prod(shape)
    if op.startswith("rms_norm"):  # x, y; backward x, dy, dx (the weight is small)
        return itemsize * elements * (5 if backward else 2)
    if op in ("swiglu", "swiglu_chunked", "geglu"):  # gate, up, y; backward dy, gate, up, dgate, dup
        return itemsize * elements * (8 if backward else 3)
    return itemsize * elements * (5 if backward else 2)
