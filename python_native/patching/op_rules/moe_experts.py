"""The mixture-of-experts experts rule: stacked experts to ``moe_experts``
(``python_native/ops/moe_experts_op.py``).

``moe_experts`` takes a module whose own parameters are a stacked ``gate_up_proj`` and ``down_proj``
(3-D, the first dim the experts; optionally ``gate_up_proj_bias`` and ``down_proj_bias``), whose
children hold no parameters (its activation), and whose forward takes ``(hidden_states, indices,
weights)``: transformers 5.x's ``*Experts`` modules (Mixtral, Qwen2/3-MoE, OLMoE, GPT-OSS, DeepSeek-V2/V3,
GraniteMoE and its shared and hybrid kinds, Jamba, PhiMoE, Laguna, GLM-4-MoE, MiniMax...), whichever
experts implementation their config runs; or, as transformers before 5.0 wrote GPT-OSS's, the
hidden states with ``router_indices`` and dense (tokens, experts) ``routing_weights`` by keyword.
The shapes say whether the weights are stored transposed; the probe finds the rest: gate and up
concatenated or interleaved, the activation (SiLU, GELU, tanh-GELU, or GPT-OSS's clamped SwiGLU with
the module's ``limit`` and ``alpha``) and how each token's experts are summed (the eager loop's
expert order, or ``grouped_mm``'s top-k order). Experts whose forward takes only the hidden states
(Llama 4's: every expert runs every token, the routing scores applied to its inputs) are left alone
with that reason: the op weighs the experts' outputs.

It probes in the module's dtype, on random parameters, and routes only calls in the dtype it
confirmed. A shared expert is a plain gated MLP (DeepSeek-V3's, Qwen2-MoE's, GraniteMoE-shared's),
which the gated-MLP rule takes.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools

import torch
from torch import nn

from python_native.ops import moe_experts_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

PROBE_TOKENS = 8
PRIORITY = 50  # after moe_route; before gated: its stacked weights are no gated MLP's


@dataclasses.dataclass(frozen=True)
class ExpertsPlan:
    activation: str
    transposed: bool
    interleaved: bool
    limit: float
    alpha: float
    combine: str
    dtype: torch.dtype  # the weights' dtype the probe confirmed
    dense: bool = False  # routing weights given per expert, (tokens, experts), by keyword (GPT-OSS before 5.0)

    op = "moe_experts"

    def options(self) -> tuple:
        return (self.activation, self.transposed, self.interleaved, self.limit, self.alpha, self.combine)

    def describe(self) -> str:
        layout = ("transposed, " if self.transposed else "") + ("interleaved" if self.interleaved else "gate|up")
        act = self.activation + (f"(limit={self.limit:g}, alpha={self.alpha:g})" if self.activation == "clamped_swiglu"
                                 else "")
        return f"{act}; {layout}; combine={self.combine}" + ("; dense routing weights" if self.dense else "")


def _stacked(module: nn.Module) -> dict[str, torch.Tensor] | None:
    params = dict(module.named_parameters(recurse=False))
    names = set(params)
    if names not in ({"gate_up_proj", "down_proj"}, {"gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"}):
        return None
    if params["gate_up_proj"].dim() != 3 or params["down_proj"].dim() != 3:
        return None
    if any(True for c in module.children() for _ in c.parameters()):
        return None
    return params


def _layouts(gate_up: torch.Tensor, down: torch.Tensor) -> list[bool]:
    """The ``transposed`` flags the shapes allow."""
    (e, a, b), (e2, c, d) = gate_up.shape, down.shape
    if e != e2:
        return []
    return [flag for flag, ok in ((False, a == 2 * d and b == c), (True, b == 2 * c and a == d)) if ok]


def _activations(module: nn.Module) -> list[tuple[str, float, float]]:
    found = [("silu", 7.0, 1.702), ("gelu", 7.0, 1.702), ("gelu_tanh", 7.0, 1.702)]
    limit, alpha = getattr(module, "limit", None), getattr(module, "alpha", None)
    if isinstance(limit, (int, float)) and isinstance(alpha, (int, float)):
        found.insert(0, ("clamped_swiglu", float(limit), float(alpha)))
    return found


def _experts_probe(module: nn.Module, params: dict[str, torch.Tensor]) -> tuple:
    """(twin with random parameters, hidden, indices, weights): each token sent to three distinct experts
    (fewer where there are fewer), so the two ways of summing them part."""
    gate_up = params["gate_up_proj"]
    experts = gate_up.shape[0]
    size = gate_up.shape[1] if _layouts(gate_up, params["down_proj"])[0] else gate_up.shape[2]
    top_k = min(3, experts)
    g = torch.Generator().manual_seed(probe.SEED)
    indices = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(PROBE_TOKENS)])
    twin = probe.with_random_parameters(module, center=0.0)
    hidden = probe.randn(PROBE_TOKENS, size, dtype=gate_up.dtype, device=gate_up.device)
    weights = probe.randn(PROBE_TOKENS, top_k, dtype=gate_up.dtype, device=gate_up.device, seed=probe.SEED + 7).abs()
    return twin, hidden, indices.to(gate_up.device), weights


def _experts_call(twin: nn.Module, plan: ExpertsPlan, hidden, indices, weights) -> torch.Tensor:
    return moe_experts_op.OP(hidden, indices, weights, twin.gate_up_proj, twin.down_proj,
                             getattr(twin, "gate_up_proj_bias", None), getattr(twin, "down_proj_bias", None),
                             *plan.options())


DENSE_EXPERTS = ("stacked expert weights, but its forward takes only the hidden states: every expert runs on every "
                 "token with the routing scores applied to its inputs (Llama 4's layout), and moe_experts takes "
                 "routed tokens and weighs the experts' outputs")


def _takes_only_hidden(module: nn.Module) -> bool:
    try:
        return len(inspect.signature(type(module).forward).parameters) == 2  # self, hidden_states
    except (TypeError, ValueError):
        return False


def _dense_call(twin: nn.Module, plan: ExpertsPlan, hidden, router_indices, routing_weights) -> torch.Tensor:
    """The dense layout: each token's weights gathered from its (tokens, experts) row, the output
    shaped (hidden's first dim, -1, hidden) as that forward shapes it."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = _experts_call(twin, plan, flat, router_indices, routing_weights.gather(1, router_indices))
    return out.view(hidden.shape[0], -1, hidden.shape[-1])


DENSE_KEYWORDS = ("router_indices", "routing_weights")


def _wanted(module: nn.Module, twin: nn.Module, hidden, indices, weights) -> tuple[torch.Tensor | None, tuple, bool]:
    """(the forward's output on the probe or None, the probe's arguments, whether it took the routing
    weights dense by keyword)."""
    wanted = probe.attempt(type(module).forward, twin, hidden, indices, weights)
    if isinstance(wanted, torch.Tensor):
        return wanted, (hidden, indices, weights), False
    dense = torch.zeros(weights.shape[0], twin.gate_up_proj.shape[0], dtype=weights.dtype,
                        device=weights.device).scatter(1, indices, weights)
    wanted = probe.attempt(type(module).forward, twin, hidden[None], router_indices=indices,
                           routing_weights=dense)
    return (wanted, (hidden[None], indices, dense), True) if isinstance(wanted, torch.Tensor) else (None, (), False)


def match_experts(module: nn.Module) -> ExpertsPlan | LeftAlone | None:
    params = _stacked(module)
    if params is None or not _layouts(params["gate_up_proj"], params["down_proj"]):
        return None
    if probe.is_meta(module):
        return LeftAlone("parameters on the meta device: no probe can confirm the forward")
    twin, hidden, indices, weights = _experts_probe(module, params)
    wanted, args, dense = _wanted(module, twin, hidden, indices, weights)
    if wanted is None:
        return LeftAlone(DENSE_EXPERTS) if _takes_only_hidden(module) else None
    call = _dense_call if dense else _experts_call
    dtype = params["gate_up_proj"].dtype
    for transposed, interleaved, (act, limit, alpha), combine in itertools.product(
            _layouts(params["gate_up_proj"], params["down_proj"]), (False, True), _activations(module),
            moe_experts_op.COMBINES):
        plan = ExpertsPlan(act, transposed, interleaved, limit, alpha, combine, dtype, dense)
        if probe.same(wanted, probe.attempt(call, twin, plan, *args)):
            return plan
    return LeftAlone("stacked expert weights, but no layout, activation or sum of moe_experts reproduces its "
                     "forward bit for bit")


def _routed(plan: ExpertsPlan, args: tuple, kwargs: dict) -> tuple | None:
    """(indices, weights) from a call's arguments as the probe confirmed them; None otherwise."""
    if not plan.dense:
        return None if kwargs or len(args) != 2 else args
    given = dict(zip(DENSE_KEYWORDS, args, strict=False))  # positional ones first
    if len(args) > 2 or set(kwargs) - set(DENSE_KEYWORDS) or set(kwargs) & set(given):
        return None
    given.update(kwargs)
    routed = tuple(given.get(k) for k in DENSE_KEYWORDS)
    return routed if all(isinstance(t, torch.Tensor) for t in routed) else None


def replace_experts(module: nn.Module, plan: ExpertsPlan):
    original = runtime.own_forward(module)
    call = _dense_call if plan.dense else _experts_call

    def forward(hidden_states, *args, **kwargs):
        routed = _routed(plan, args, kwargs)
        if routed is None or module.gate_up_proj.dtype != plan.dtype:
            runtime.declined("moe_experts", hidden_states, "arguments or a dtype the probe did not confirm: the "
                             "module's own forward ran")
            return original(hidden_states, *args, **kwargs)
        runtime.routing("moe_experts", hidden_states)
        return call(module, plan, hidden_states, *routed)

    return forward


RULES = [PatchRule("moe_experts", match_experts, replace_experts, ops=("moe_experts",),
                   description="mixture-of-experts experts stored as stacked gate_up_proj/down_proj weights")]
