"""Benchmark rows of the ops model patching routes to (``torch.ops.python_native.*``).

Each row calls the op: with the overrides on, the Triton kernels; with the DSL disabled (the
"aten" column), the op's reference, which is the plain-torch formula of the module the op
replaces, as an unpatched model runs it. Inductor compiles that formula (``FORMULAS``), not the
op. Most rows are declared with their ops (``Op.bench_rows``, ``python_native_dsls.proving``) and
read from the declarations here: LLM training shapes of norms, gated MLPs, rotary embedding and
activations. The MoE rows are this module's own: they route and run a small layer and
Qwen3-30B-A3B's (hidden 2048, expert intermediate 768, 128 experts, top 8, 8192 tokens); they are
GEMM-bound, so their figure of merit is time (``moe_flops`` gives the FLOPs a rate is taken from),
and their bytes are the least any kernel must move.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native_dsls.catalogue import built_ops
from python_native_dsls.proving import BenchRow


def _declared() -> dict[str, BenchRow]:
    """The rows the declarations carry, by name, in declaration order (the first op to declare a name wins)."""
    found: dict[str, BenchRow] = {}
    for built in built_ops():
        for row in built.op.bench_rows:
            found.setdefault(row.name, row)
    return found


DECLARED = _declared()

# op -> (quick shapes, full shapes): (tokens, experts, top k) and (tokens, hidden, expert intermediate,
# experts, top k).
_MOE_SHAPES: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    "moe_route": ([(8, 16, 4)], [(2048, 64, 8), (8192, 128, 8)]),
    "moe_experts": ([(8, 32, 16, 4, 2)], [(2048, 1024, 512, 16, 4), (8192, 2048, 768, 128, 8)]),
}
SHAPES: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {
    **{name: (list(row.quick), list(row.full)) for name, row in DECLARED.items()}, **_MOE_SHAPES}
OPS = tuple(SHAPES)


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


def make_inputs(op: str, shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
    """The row's tensors by name (``leaves``: those gradients are reset for; ``dy``: the gradient
    the output(s) receive)."""
    if op in DECLARED:
        return DECLARED[op].inputs(shape, dtype, device, grad)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype) * scale

    return _moe_inputs(op, shape, randn, grad)


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


def _ops():
    return torch.ops.python_native


FUNCTIONS: dict[str, Callable[[dict], object]] = {
    **{name: row.call for name, row in DECLARED.items()},
    "moe_route": lambda t: _ops().moe_route(t["logits"], t["k"], "softmax", False, True)[0],  # the weights
    "moe_experts": lambda t: _ops().moe_experts(t["hidden"], t["indices"], t["weights"], t["gate_up"], t["down"]),
}
FORMULAS: dict[str, Callable[[dict], object]] = {name: row.formula for name, row in DECLARED.items() if row.formula}


def bytes_moved(op: str, shape: tuple[int, ...], mode: str, itemsize: int) -> int:
    """What the op must move: every input read once, every output written once (forward; the
    backward reads the forward's inputs and the output gradients and writes the input gradients)."""
    if op in DECLARED:
        return DECLARED[op].bytes(shape, mode, itemsize)
    backward = mode == "fwd+bwd"
    if op == "moe_route":  # logits, weights, int64 indices; backward dweights, logits, indices, dlogits
        tokens, experts, k = shape
        forward = tokens * (experts * itemsize + k * (itemsize + 8))
        return forward + (tokens * (2 * experts * itemsize + k * (itemsize + 8)) if backward else 0)
    # moe_experts: the weights once, hidden and routing in, the output out (backward: twice, and dy)
    tokens, hidden, inner, experts, k = shape
    weights = 3 * experts * inner * hidden * itemsize
    acts = tokens * (2 * hidden * itemsize + k * (itemsize + 8))
    return 3 * weights + 2 * acts + tokens * hidden * itemsize if backward else weights + acts
