"""``python_native::moe_experts``: a mixture-of-experts layer's experts, from routed tokens to their sum.

transformers 5.x keeps a family's experts as stacked 3-D weights (``gate_up_proj``, ``down_proj``)
and runs them in a Python loop over the experts hit (``eager``) or through ``grouped_mm``. This op
takes what those forwards take: ``hidden`` (tokens, hidden), the router's ``indices`` and
``weights`` (tokens, top-k), the stacked weights and their optional biases, and returns the
weighted sum of each token's experts. Its arguments name how families differ:

- ``transposed``: ``gate_up`` is ``[E, 2I, H]`` and ``down`` ``[E, H, I]`` (``F.linear``'s layout:
  Mixtral, Qwen3-MoE, OLMoE), or ``[E, H, 2I]`` and ``[E, I, H]`` (GPT-OSS);
- ``interleaved``: gate and up are the two halves of the projection (``chunk(2, -1)``), or its even
  and odd columns (GPT-OSS);
- ``activation``: ``silu`` (SwiGLU), ``gelu`` or ``gelu_tanh`` (GeGLU), or ``clamped_swiglu``:
  GPT-OSS's ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`` with ``g = min(gate, limit)``;
- ``combine``: ``sum`` adds each token's top-k rows in top-k order, once, in the rows' dtype (the
  ``grouped_mm`` path); ``index_add`` adds the experts in expert order into the hidden dtype (the
  eager loop). With K <= 2 both give the same bits.

The reference groups the (token, slot) pairs by expert (a stable sort) and runs each expert's two
GEMMs as the modules do, so with no override serving, a patched module's output is the module's bit
for bit. ``moe_experts_backward`` recomputes each expert's activations and returns every gradient;
the hidden states' is summed per token over its top-k rows in a fixed order (no scatter-add).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from python_native.foundations import custom_ops, module_scope, public_names

Tensor = torch.Tensor

ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "clamped_swiglu")
COMBINES = ("sum", "index_add")
ARGS = ("Tensor hidden, Tensor indices, Tensor weights, Tensor gate_up, Tensor down, Tensor? gate_up_bias{d}, "
        "Tensor? down_bias{d}, str activation{a}, bool transposed{f}, bool interleaved{f}, float limit{lim}, "
        "float alpha{alp}, str combine{c}")
SCHEMA = "moe_experts(" + ARGS.format(d="=None", a="='silu'", f="=False", lim="=7.0", alp="=1.702", c="='sum'") \
    + ") -> Tensor"
BACKWARD_SCHEMA = "moe_experts_backward(Tensor grad_output, " + ARGS.format(d="", a="", f="", lim="", alp="", c="") \
    + ") -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"


def _shape(t: Tensor | None) -> tuple | None:
    return None if t is None else tuple(t.shape)


def check_arguments(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                    gate_up_bias: Tensor | None, down_bias: Tensor | None, activation: str, transposed: bool,
                    combine: str) -> None:
    """``ValueError`` naming what the op cannot take (metadata only: FakeTensor safe)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"moe_experts: activation={activation!r}; allowed: {list(ACTIVATIONS)}")
    if combine not in COMBINES:
        raise ValueError(f"moe_experts: combine={combine!r}; allowed: {list(COMBINES)}")
    if hidden.dim() != 2 or indices.dim() != 2 or indices.shape[0] != hidden.shape[0] or weights.shape != indices.shape:
        raise ValueError(f"moe_experts: hidden must be (tokens, hidden) and indices, weights (tokens, top_k), got "
                         f"{tuple(hidden.shape)}, {tuple(indices.shape)}, {tuple(weights.shape)}")
    if indices.dtype not in (torch.int64, torch.int32) or not weights.is_floating_point() or not hidden.is_floating_point():
        raise ValueError(f"moe_experts: indices must be int64 or int32 and hidden, weights floating point, got "
                         f"{indices.dtype}, {hidden.dtype}, {weights.dtype}")
    size = hidden.shape[1]
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[0] != down.shape[0]:
        raise ValueError(f"moe_experts: gate_up and down must be stacked 3-D expert weights, got "
                         f"{tuple(gate_up.shape)} and {tuple(down.shape)}")
    experts, inner = down.shape[0], (down.shape[1] if transposed else down.shape[2])
    want = ((experts, size, 2 * inner), (experts, inner, size)) if transposed else \
        ((experts, 2 * inner, size), (experts, size, inner))
    if (tuple(gate_up.shape), tuple(down.shape)) != want:
        raise ValueError(f"moe_experts: for hidden size {size} and transposed={transposed}, gate_up and down must be "
                         f"{want[0]} and {want[1]} (E, and I from down), got {tuple(gate_up.shape)} and {tuple(down.shape)}")
    biases = ((gate_up_bias, (experts, 2 * inner)), (down_bias, (experts, size)))
    if any(b is not None and tuple(b.shape) != s for b, s in biases):
        raise ValueError(f"moe_experts: biases must be {biases[0][1]} and {biases[1][1]} (or None), got "
                         f"{_shape(gate_up_bias)} and {_shape(down_bias)}")


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, transposed: bool) -> Tensor:
    out = x @ weight if transposed else F.linear(x, weight)
    return out if bias is None else out + bias


def _split(gate_up: Tensor, interleaved: bool) -> tuple[Tensor, Tensor]:
    if interleaved:
        return gate_up[..., ::2], gate_up[..., 1::2]
    gate, up = gate_up.chunk(2, dim=-1)
    return gate, up


def _merge(grad_gate: Tensor, grad_up: Tensor, interleaved: bool) -> Tensor:
    if interleaved:
        return torch.stack((grad_gate, grad_up), dim=-1).flatten(-2)
    return torch.cat((grad_gate, grad_up), dim=-1)


def activate(gate: Tensor, up: Tensor, activation: str, limit: float, alpha: float) -> Tensor:
    """The gated activation, as the modules write it."""
    if activation == "clamped_swiglu":
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    if activation == "silu":
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh" if activation == "gelu_tanh" else "none") * up


def activate_backward(grad: Tensor, gate: Tensor, up: Tensor, activation: str, limit: float,
                      alpha: float) -> tuple[Tensor, Tensor]:
    """(grad_gate, grad_up) of ``activate``, in fp32, cast back to the operands' dtype."""
    g, gate32, up32 = grad.float(), gate.float(), up.float()
    if activation == "clamped_swiglu":
        gc, uc = gate32.clamp(max=limit), up32.clamp(min=-limit, max=limit)
        s = torch.sigmoid(gc * alpha)
        grad_up = g * (gc * s) * ((up32 >= -limit) & (up32 <= limit))
        grad_gate = g * (uc + 1) * (s + gc * alpha * s * (1 - s)) * (gate32 <= limit)
    elif activation == "silu":
        grad_gate, grad_up = torch.ops.aten.silu_backward(g * up32, gate32), g * F.silu(gate32)
    else:
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        grad_gate = torch.ops.aten.gelu_backward(g * up32, gate32, approximate=approximate)
        grad_up = g * F.gelu(gate32, approximate=approximate)
    return grad_gate.to(gate.dtype), grad_up.to(up.dtype)


def groups(indices: Tensor, experts: int) -> tuple[Tensor, list[int]]:
    """The (token, slot) pairs' flat positions sorted by expert (stably), and each expert's count."""
    flat = indices.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= experts):
        raise ValueError(f"moe_experts: expert indices must lie in [0, {experts}), got values from "
                         f"{int(flat.min())} to {int(flat.max())}")
    return torch.argsort(flat, stable=True), torch.bincount(flat, minlength=experts).tolist()


def _bias(bias: Tensor | None, e: int) -> Tensor | None:
    return None if bias is None else bias[e]


def _reference(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
               gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, activation: str = "silu",
               transposed: bool = False, interleaved: bool = False, limit: float = 7.0, alpha: float = 1.702,
               combine: str = "sum") -> Tensor:
    check_arguments(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed, combine)
    tokens, top_k = indices.shape
    order, counts = groups(indices, gate_up.shape[0])
    flat_weights = weights.reshape(-1)
    final = torch.zeros_like(hidden) if combine == "index_add" else None
    rows = None
    start = 0
    for e, count in enumerate(counts):
        if not count:
            continue
        chosen = order[start:start + count]
        start += count
        token = chosen // top_k
        gate, up = _split(_linear(hidden[token], gate_up[e], _bias(gate_up_bias, e), transposed), interleaved)
        out = _linear(activate(gate, up, activation, limit, alpha), down[e], _bias(down_bias, e), transposed)
        out = out * flat_weights[chosen, None]
        if final is not None:
            final.index_add_(0, token, out.to(final.dtype))
            continue
        if rows is None:
            rows = hidden.new_zeros((tokens * top_k, hidden.shape[1]), dtype=out.dtype)
        rows[chosen] = out
    if final is not None:
        return final
    if rows is None:
        return torch.zeros_like(hidden)
    return rows.view(tokens, top_k, -1).sum(dim=1).to(hidden.dtype)


def _reference_backward(grad_output: Tensor, hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor,
                        down: Tensor, gate_up_bias: Tensor | None, down_bias: Tensor | None, activation: str,
                        transposed: bool, interleaved: bool, limit: float, alpha: float,
                        combine: str) -> tuple[Tensor, ...]:
    check_arguments(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed, combine)
    tokens, top_k = indices.shape
    order, counts = groups(indices, gate_up.shape[0])
    flat_weights = weights.reshape(-1)
    grads = [hidden.new_zeros((tokens * top_k, hidden.shape[1])), torch.zeros_like(flat_weights),
             torch.zeros_like(gate_up), torch.zeros_like(down),
             hidden.new_empty(0) if gate_up_bias is None else torch.zeros_like(gate_up_bias),
             hidden.new_empty(0) if down_bias is None else torch.zeros_like(down_bias)]
    start = 0
    with torch.no_grad():
        for e, count in enumerate(counts):
            if count:
                chosen = order[start:start + count]
                start += count
                _expert_backward(grad_output, hidden, chosen, chosen // top_k, flat_weights, e, grads,
                                 (gate_up, down, gate_up_bias, down_bias), (activation, transposed, interleaved,
                                                                           limit, alpha))
    grad_rows, grad_weights, *rest = grads
    return (grad_rows.view(tokens, top_k, -1).sum(dim=1), grad_weights.view_as(weights), *rest)


def _expert_backward(grad_output: Tensor, hidden: Tensor, chosen: Tensor, token: Tensor, flat_weights: Tensor,
                     e: int, grads: list[Tensor], params: tuple, options: tuple) -> None:
    """One expert's share of every gradient, written into ``grads`` at its rows and its weights."""
    gate_up, down, gate_up_bias, down_bias = params
    activation, transposed, interleaved, limit, alpha = options
    x = hidden[token]
    gate, up = _split(_linear(x, gate_up[e], _bias(gate_up_bias, e), transposed), interleaved)
    h = activate(gate, up, activation, limit, alpha)
    out = _linear(h, down[e], _bias(down_bias, e), transposed)
    w = flat_weights[chosen, None]
    g = grad_output[token]
    wide = torch.promote_types(out.dtype, w.dtype)
    grads[1][chosen] = (g.to(wide) * out.to(wide)).sum(-1).to(flat_weights.dtype)
    grad_out = (g.to(wide) * w.to(wide)).to(out.dtype)
    if down_bias is not None:
        grads[5][e] = grad_out.sum(0).to(down_bias.dtype)
    grads[3][e] = (h.t() @ grad_out) if transposed else (grad_out.t() @ h)
    grad_h = grad_out @ (down[e].t() if transposed else down[e])
    grad_gate_up = _merge(*activate_backward(grad_h, gate, up, activation, limit, alpha), interleaved)
    if gate_up_bias is not None:
        grads[4][e] = grad_gate_up.sum(0).to(gate_up_bias.dtype)
    grads[2][e] = (x.t() @ grad_gate_up) if transposed else (grad_gate_up.t() @ x)
    grads[0][chosen] = (grad_gate_up @ (gate_up[e].t() if transposed else gate_up[e])).to(hidden.dtype)


def _fake(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
          gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, activation: str = "silu",
          transposed: bool = False, interleaved: bool = False, limit: float = 7.0, alpha: float = 1.702,
          combine: str = "sum") -> Tensor:
    check_arguments(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed, combine)
    return torch.empty_like(hidden)


def _fake_backward(grad_output: Tensor, hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor,
                   down: Tensor, gate_up_bias: Tensor | None, down_bias: Tensor | None, *options) -> tuple[Tensor, ...]:
    return (torch.empty_like(hidden), torch.empty_like(weights), torch.empty_like(gate_up), torch.empty_like(down),
            hidden.new_empty(0) if gate_up_bias is None else torch.empty_like(gate_up_bias),
            hidden.new_empty(0) if down_bias is None else torch.empty_like(down_bias))


def _setup_context(ctx, inputs, output) -> None:
    hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, *options = inputs
    ctx.save_for_backward(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias)
    ctx.options = tuple(options)
    ctx.module = module_scope.current()


def _autograd_backward(ctx, grad_output):
    saved = ctx.saved_tensors
    with module_scope.inside(ctx.module):
        grad_hidden, grad_weights, grad_gate_up, grad_down, grad_gub, grad_db = BACKWARD(grad_output, *saved, *ctx.options)
    needs = ctx.needs_input_grad
    picked = (grad_hidden, None, grad_weights, grad_gate_up, grad_down,
              grad_gub if saved[5] is not None else None, grad_db if saved[6] is not None else None)
    return (*(g if need else None for g, need in zip(picked, needs, strict=False)), *(None for _ in ctx.options))


OP = custom_ops.declare(SCHEMA, reference=_reference, fake=_fake, backward=_autograd_backward,
                      setup_context=_setup_context,
                      doc="routed tokens through their experts' gated MLPs, weighted and summed per token")
BACKWARD = custom_ops.declare(BACKWARD_SCHEMA, reference=_reference_backward, fake=_fake_backward,
                            doc="(grad_hidden, grad_weights, grad_gate_up, grad_down, grad biases) of moe_experts")
public_names.declare("moe_experts", "moe_experts")
public_names.declare("moe_experts", "moe_experts_backward", backward=True)


def moe_experts(hidden: Tensor, indices: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, activation: str = "silu",
                transposed: bool = False, interleaved: bool = False, limit: float = 7.0, alpha: float = 1.702,
                combine: str = "sum") -> Tensor:
    """Each token's experts (``indices``) applied to ``hidden`` and summed with ``weights`` (see the module's
    docstring). Calls ``torch.ops.python_native.moe_experts``, so installed overrides serve it."""
    return OP(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed,
              interleaved, limit, alpha, combine)
