"""``python_native::moe_route`` and ``moe_experts``: a mixture-of-experts layer, forward and backward.

The ops are declared by ``python_native.ops``; these overrides shadow their references:

- ``moe_route``: one program per token picks its top-k experts (softmax, sigmoid with a correction
  bias, or the logits themselves for top-k-then-softmax), renormalises and scales them; its
  backward takes the weights' gradient to the logits through the chosen positions. Group-limited
  routing (``n_group > 1``, DeepSeek-V3's) masks all but each row's ``topk_group`` best groups in
  the same program before the top-k.
- ``moe_experts``: the (token, slot) pairs sorted by expert, gate/up as one grouped GEMM with the
  activation fused, down as another weighted by the routing weights, each token's rows summed in
  slot order. The backward recomputes the activations and writes every gradient without atomics:
  the weights' and biases' per expert over its rows, the hidden states' per token over its slots.

Results match the references to fp32 rounding, not bit for bit (other summation orders).
"""

from __future__ import annotations

import torch

from python_native.ops import moe_experts_op, moe_route_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import BenchRow, Driver, Sample, leaf, rand

from ..plans.layout import MAX_INDEX
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
NAMESPACE = "python_native"
MAX_EXPERTS = 1024  # one router row per program, in registers
MAX_GROUPED = 16384  # group-limited routing: a (groups, experts) membership tile, in registers
ROUTE_KEY = ("logits", "top_k", "scoring", "topk_first", "renormalize", "renormalize_eps", "bias", "n_group",
             "topk_group", "scaling", "keep_float")
EXPERTS_KEY = ("hidden", "indices", "weights", "gate_up", "down", "gate_up_bias", "down_bias", "activation",
               "transposed", "interleaved", "limit", "alpha", "combine")


def _route_why(logits: Tensor, top_k: int, scoring: str, topk_first: bool, bias: Tensor | None, n_group: int,
               topk_group: int) -> str | None:
    try:
        moe_route_op.check_arguments(logits, top_k, scoring, topk_first, bias, n_group, topk_group)
    except ValueError as e:
        return str(e)
    found = why.device(logits, bias) or why.dtype(logits, "logits dtype") or (bias is not None and why.dtype(bias))
    if found:
        return found
    if n_group > 1 and top_k > topk_group * (logits.shape[1] // n_group):
        return (f"top_k={top_k} exceeds the {topk_group * (logits.shape[1] // n_group)} experts of the "
                f"topk_group={topk_group} chosen groups (the reference picks among the masked ones)")
    if n_group > 1 and (1 << (n_group - 1).bit_length()) * logits.shape[1] > MAX_GROUPED:
        return f"{n_group} groups of {logits.shape[1]} experts (the kernel holds up to {MAX_GROUPED} group x expert cells)"
    if bias is not None and bias.stride(0) != 1:
        return f"bias at stride {bias.stride(0)} (the kernel reads it dense)"
    if logits.shape[1] > MAX_EXPERTS or logits.stride(1) != 1:
        return f"{logits.shape[1]} experts at column stride {logits.stride(1)} (the kernel takes up to {MAX_EXPERTS}, dense rows)"
    return None if logits.numel() < MAX_INDEX else f"{logits.numel()} logits exceed int32 offsets"


def route_plan_or_why(logits: Tensor, top_k: int, scoring: str = "softmax", topk_first: bool = False,
                      renormalize: bool = False, renormalize_eps: float = 0.0, bias: Tensor | None = None,
                      n_group: int = 1, topk_group: int = 1, scaling: float = 1.0, keep_float: bool = False):
    found = _route_why(logits, top_k, scoring, topk_first, bias, n_group, topk_group)
    if found:
        return found
    computed = torch.float32 if scoring == "softmax" and not topk_first else logits.dtype
    return (computed if keep_float else logits.dtype,)


def route_backward_plan_or_why(grad_weights: Tensor, logits: Tensor, indices: Tensor, top_k: int,
                               scoring: str = "softmax", topk_first: bool = False, renormalize: bool = False,
                               renormalize_eps: float = 0.0, bias: Tensor | None = None, n_group: int = 1,
                               topk_group: int = 1, scaling: float = 1.0, keep_float: bool = False):
    found = _route_why(logits, top_k, scoring, topk_first, bias, n_group, topk_group)
    if found:
        return found
    if tuple(indices.shape) != (logits.shape[0], top_k) or tuple(grad_weights.shape) != tuple(indices.shape):
        return f"indices {tuple(indices.shape)} and grad_weights {tuple(grad_weights.shape)} are not (tokens, top_k)"
    return why.device(grad_weights, indices) or why.dtype(grad_weights, "grad_weights dtype") or (True,)


def route_impl(logits: Tensor, top_k: int, scoring: str = "softmax", topk_first: bool = False,
               renormalize: bool = False, renormalize_eps: float = 0.0, bias: Tensor | None = None, n_group: int = 1,
               topk_group: int = 1, scaling: float = 1.0, keep_float: bool = False, plan=None) -> tuple[Tensor, Tensor]:
    plan = plan or FAMILY["moe_route"].require(logits, top_k, scoring, topk_first, renormalize, renormalize_eps, bias,
                                               n_group, topk_group, scaling, keep_float)
    return FAMILY.kernels().route(logits, top_k, scoring == "sigmoid", topk_first, renormalize, renormalize_eps, bias,
                                  scaling, plan[0], n_group, topk_group)


def route_backward_impl(grad_weights: Tensor, logits: Tensor, indices: Tensor, top_k: int, scoring: str = "softmax",
                        topk_first: bool = False, renormalize: bool = False, renormalize_eps: float = 0.0,
                        bias: Tensor | None = None, n_group: int = 1, topk_group: int = 1, scaling: float = 1.0,
                        keep_float: bool = False, plan=None) -> Tensor:
    return FAMILY.kernels().route_backward(grad_weights, logits, indices, scoring == "sigmoid", topk_first, renormalize,
                                           renormalize_eps, scaling)


def _experts_why(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                 gate_up_bias: Tensor | None, down_bias: Tensor | None, activation: str, transposed: bool,
                 combine: str) -> str | None:
    try:
        moe_experts_op.check_arguments(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation,
                                       transposed, combine)
    except ValueError as e:
        return str(e)
    found = why.device(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias)
    for what, t in (("hidden", hidden), ("weights", weights), ("gate_up", gate_up), ("down", down)):
        found = found or why.dtype(t, f"{what} dtype")
    if found:
        return found
    if hidden.is_cuda and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is capturing: grouping the tokens by expert reads the per-expert counts on the host"
    for what, b in (("gate_up_bias", gate_up_bias), ("down_bias", down_bias)):
        if b is not None and b.stride(-1) != 1:
            return f"{what} at column stride {b.stride(-1)} (the kernels read bias rows dense)"
    if len({hidden.dtype, gate_up.dtype, down.dtype}) != 1:
        return f"hidden, gate_up and down dtypes differ ({hidden.dtype}, {gate_up.dtype}, {down.dtype})"
    if not hidden.numel() or not indices.numel():
        return "empty input"
    # int32 offsets: sorted rows (H or 2I wide) and within one expert's weights (expert offsets are int64)
    width = max(hidden.shape[1], gate_up.numel() // (gate_up.shape[0] * hidden.shape[1]))
    if max(indices.numel() * width, gate_up.numel() // gate_up.shape[0]) > MAX_INDEX:
        return f"{indices.numel()} routed rows: offsets past int32 in the sorted rows"
    return None


def experts_plan_or_why(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                        gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, activation: str = "silu",
                        transposed: bool = False, interleaved: bool = False, limit: float = 7.0, alpha: float = 1.702,
                        combine: str = "sum"):
    found = _experts_why(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed,
                         combine)
    return found or (activation, transposed, interleaved, float(limit), float(alpha))


def experts_backward_plan_or_why(grad_output: Tensor, hidden: Tensor, indices: Tensor, weights: Tensor,
                                 gate_up: Tensor, down: Tensor, gate_up_bias: Tensor | None, down_bias: Tensor | None,
                                 activation: str, transposed: bool, interleaved: bool, limit: float, alpha: float,
                                 combine: str):
    found = (_experts_why(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed,
                          combine) or why.device(grad_output) or why.same(hidden, grad_output, "grad_output"))
    return found or (activation, transposed, interleaved, float(limit), float(alpha))


def experts_impl(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                 gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, activation: str = "silu",
                 transposed: bool = False, interleaved: bool = False, limit: float = 7.0, alpha: float = 1.702,
                 combine: str = "sum", plan=None) -> Tensor:
    k = FAMILY.kernels()
    options = plan or (activation, transposed, interleaved, float(limit), float(alpha))
    s = k.Sorted(indices, gate_up.shape[0])
    x = hidden.index_select(0, s.token)
    h = k.gate_up(x, gate_up, gate_up_bias, s, options)
    scale = weights.reshape(-1).index_select(0, s.order)
    rows = k.grouped(h, down, k._matrix(down, transposed), hidden.shape[1], s, down_bias, scale, dtype=torch.float32,
                     rounded=torch.promote_types(hidden.dtype, weights.dtype))
    return s.to_tokens(rows).to(hidden.dtype)


def experts_backward_impl(grad_output: Tensor, hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor,
                          down: Tensor, gate_up_bias: Tensor | None, down_bias: Tensor | None, activation: str,
                          transposed: bool, interleaved: bool, limit: float, alpha: float, combine: str,
                          plan=None) -> tuple[Tensor, ...]:
    k = FAMILY.kernels()
    options = plan or (activation, transposed, interleaved, float(limit), float(alpha))
    s = k.Sorted(indices, gate_up.shape[0])
    x = hidden.index_select(0, s.token)
    h = k.gate_up(x, gate_up, gate_up_bias, s, options)
    raw = k.grouped(h, down, k._matrix(down, transposed), hidden.shape[1], s, down_bias, dtype=torch.float32)
    g = grad_output.index_select(0, s.token).float()
    flat = weights.reshape(-1)
    grad_weights = torch.empty_like(flat)
    grad_weights[s.order] = (g * raw).sum(-1).to(flat.dtype)
    go = (g * flat.index_select(0, s.order).float()[:, None]).to(h.dtype)
    grad_h = k.grouped(go, down, k._matrix(down, not transposed), h.shape[1], s)
    grad_gate_up_rows = k.gate_up(x, gate_up, gate_up_bias, s, options, grad_h=grad_h)
    grad_x = k.grouped(grad_gate_up_rows, gate_up, k._matrix(gate_up, not transposed), hidden.shape[1], s,
                       dtype=torch.float32)
    return (s.to_tokens(grad_x).to(hidden.dtype), grad_weights.view_as(weights),
            _weight_grad(k, grad_gate_up_rows, x, gate_up, transposed, s), _weight_grad(k, go, h, down, transposed, s),
            _bias_grad(k, grad_gate_up_rows, gate_up_bias, s), _bias_grad(k, go, down_bias, s))


def _weight_grad(k, a: Tensor, b: Tensor, like: Tensor, transposed: bool, s) -> Tensor:
    """``a^T @ b`` per expert, in ``like``'s layout: [E, out, in], or [E, in, out] where transposed."""
    grad = torch.empty_like(like, memory_format=torch.contiguous_format)
    strides = (grad.stride(0), grad.stride(2), grad.stride(1)) if transposed else grad.stride()
    k.outer(a, b, grad, strides, s)
    return grad


def _bias_grad(k, a: Tensor, bias: Tensor | None, s) -> Tensor:
    if bias is None:
        return a.new_empty(0)
    grad = torch.empty_like(bias, memory_format=torch.contiguous_format)
    k.outer(a, torch.ones(a.shape[0], 1, dtype=a.dtype, device=a.device), grad, (grad.stride(0), 1, 0), s)
    return grad


def _ops():
    return torch.ops.python_native


def _route_cases(dtype: torch.dtype, device: str) :
    variants = {"softmax, top-k, renormalised (Mixtral)": (2, "softmax", False, True),
                "softmax, top-k (OLMoE)": (3, "softmax", False, False),
                "top-k, then softmax (GPT-OSS)": (4, "softmax", True, False),
                "sigmoid, renormalised, scaled": (2, "sigmoid", False, True)}
    for name, (top_k, scoring, first, renorm) in variants.items():
        yield Sample(name, lambda x, _a=(top_k, scoring, first, renorm): _ops().moe_route(x, *_a, 1e-20, None, 1, 1, 2.0),
                     [rand(7, 8, dtype=dtype, device=device)])


def _experts_cases(dtype: torch.dtype, device: str) :
    tokens, size, inner, experts = 7, 32, 24, 4
    g = torch.Generator().manual_seed(0)  # expert 3 gets no token
    indices = torch.stack([torch.randperm(3, generator=g)[:2] for _ in range(tokens)]).to(device)
    for name, transposed, act in (("SwiGLU, F.linear layout", False, "silu"), ("clamped SwiGLU, transposed", True,
                                                                               "clamped_swiglu")):
        shapes = ((experts, size, 2 * inner), (experts, inner, size)) if transposed else \
            ((experts, 2 * inner, size), (experts, size, inner))
        def call(h, w, gu, d, _t=transposed, _a=act):
            return _ops().moe_experts(h, indices, w, gu, d, None, None, _a, _t, _t, 7.0, 1.702, "sum")

        yield Sample(name, call, [rand(tokens, size, dtype=dtype, device=device), rand(tokens, 2, dtype=dtype, device=device),
                                  rand(*shapes[0], dtype=dtype, device=device, scale=0.2),
                                  rand(*shapes[1], dtype=dtype, device=device, scale=0.2)])


def _row_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> dict:
    """Router logits of a ``moe_route`` row (tokens, experts, top k), or a routed layer of a ``moe_experts``
    row (tokens, hidden, expert intermediate, experts, top k): tokens routed by softmax top-k of random
    logits (made here, not timed), experts in ``F.linear``'s layout at an initializer's scale."""
    def randn(*size: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*size, device=device, dtype=dtype) * scale

    if len(shape) == 3:
        tokens, experts, k = shape
        logits = leaf(randn(tokens, experts), grad)
        return {"logits": logits, "k": k, "leaves": [logits] if grad else [], "dy": randn(tokens, k) if grad else None}
    tokens, hidden, inner, experts, k = shape
    x = leaf(randn(tokens, hidden), grad)
    with torch.no_grad():
        top = randn(tokens, experts).float().softmax(-1).topk(k)
    weights = leaf((top.values / top.values.sum(-1, keepdim=True)).to(x.dtype), grad)
    gate_up = leaf(randn(experts, 2 * inner, hidden, scale=hidden ** -0.5), grad)
    down = leaf(randn(experts, hidden, inner, scale=inner ** -0.5), grad)
    leaves = [x, weights, gate_up, down] if grad else []
    return {"hidden": x, "indices": top.indices, "weights": weights, "gate_up": gate_up, "down": down,
            "leaves": leaves, "dy": randn(tokens, hidden) if grad else None}


def _route_bytes(shape: tuple[int, ...], mode: str, itemsize: int) -> int:
    """Logits in, weights and int64 indices out (backward: dweights, logits, indices in, dlogits out)."""
    tokens, experts, k = shape
    forward = tokens * (experts * itemsize + k * (itemsize + 8))
    return forward + (tokens * (2 * experts * itemsize + k * (itemsize + 8)) if mode == "fwd+bwd" else 0)


def _experts_bytes(shape: tuple[int, ...], mode: str, itemsize: int) -> int:
    """The weights once, hidden and routing in, the output out (backward: the weights three times, and dy)."""
    tokens, hidden, inner, experts, k = shape
    weights = 3 * experts * inner * hidden * itemsize
    acts = tokens * (2 * hidden * itemsize + k * (itemsize + 8))
    return 3 * weights + 2 * acts + tokens * hidden * itemsize if mode == "fwd+bwd" else weights + acts


def _experts_flops(shape: tuple[int, ...], mode: str) -> int:
    """Two multiply-adds per weight per routed token (gate/up and down); the backward twice that
    again (the inputs' and the weights' gradients)."""
    tokens, hidden, inner, _, k = shape
    forward = 2 * tokens * k * 3 * inner * hidden
    return forward * (3 if mode == "fwd+bwd" else 1)


# A small layer and Qwen3-30B-A3B's (hidden 2048, expert intermediate 768, 128 experts, top 8, 8192
# tokens): GEMM-bound, their figure of merit is time; their bytes are the least any kernel must move.
_ROUTE_ROW = BenchRow("moe_route", ((8, 16, 4),), ((2048, 64, 8), (8192, 128, 8)), _row_inputs,
                      lambda t: _ops().moe_route(t["logits"], t["k"], "softmax", False, True)[0], _route_bytes)
_EXPERTS_ROW = BenchRow("moe_experts", ((8, 32, 16, 4, 2),), ((2048, 1024, 512, 16, 4), (8192, 2048, 768, 128, 8)),
                        _row_inputs, lambda t: _ops().moe_experts(t["hidden"], t["indices"], t["weights"], t["gate_up"],
                                                                  t["down"]), _experts_bytes,
                        flops=_experts_flops)

FAMILY = Family(DSL_NAME, "moe", [
    Op("moe_route", route_plan_or_why, route_impl, ROUTE_KEY, public_name="moe_route", measured=False, lib=NAMESPACE,
       verify=Driver(_route_cases), bench_rows=(_ROUTE_ROW,)),
    Op("moe_route_backward", route_backward_plan_or_why, route_backward_impl, ("grad_weights", "indices", *ROUTE_KEY),
       public_name="moe_route", backward=True, measured=False, lib=NAMESPACE, bench=("moe_route",)),
    Op("moe_experts", experts_plan_or_why, experts_impl, EXPERTS_KEY, public_name="moe_experts", measured=False,
       lib=NAMESPACE, verify=Driver(_experts_cases), bench_rows=(_EXPERTS_ROW,)),
    Op("moe_experts_backward", experts_backward_plan_or_why, experts_backward_impl, ("grad_output", *EXPERTS_KEY),
       public_name="moe_experts", backward=True, measured=False, lib=NAMESPACE,
       bench=("moe_experts",)),
], kernels="moe")
