"""The mixture-of-experts router rule: routers to ``moe_route`` (``python_native/ops/moe_route_op.py``).

``moe_router`` takes a module with a ``weight`` of (experts, hidden), an optional ``bias`` of
(experts), an integer ``top_k``, no children and a forward of one tensor that returns ``(logits,
weights, indices)`` (or, GPT-OSS before 5.0, the weights scattered to (tokens, experts) and the
indices): the routers' linear layer (in the weights' dtype, in fp32, or in the weights' dtype then
made fp32 with the weights cast back, as GraniteMoE and Laguna do), then ``moe_route`` in the
variant the probe finds (softmax then top-k, renormalised or not, kept in fp32 or cast back; top-k
then softmax; sigmoid with the module's correction bias, a buffer or a frozen parameter, groups and
scaling factor). A router returning other tensors (Llama 4's dense scores and logits) or drawing
random numbers (a sampling router) is left alone, saying which; PhiMoE's, which jitters its input
in place, is refused before any probe (``effects``).

It probes in the module's dtype, on random parameters (routers start at zero), and routes only calls
in the dtype it confirmed. Qwen2-MoE's shared-expert gate, one linear output per token, stays aten's.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from python_native.ops import moe_route_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

PROBE_TOKENS = 8
PRIORITY = 60  # after the norms, before moe_experts


@dataclasses.dataclass(frozen=True)
class RouterPlan:
    top_k: int
    fp32_logits: bool  # the linear layer in fp32 (DeepSeek-V3), else in the weight's dtype
    flatten: bool  # inputs of any rank, flattened to (tokens, hidden); else 2-D inputs only
    route: tuple  # moe_route's options after top_k, the bias left out (``bias_buffer`` names it)
    bias_buffer: str | None
    dtype: torch.dtype
    dense: bool = False  # returns (weights scattered to (tokens, experts), indices) (GPT-OSS before 5.0)
    upcast: bool = False  # logits made fp32 after the linear layer, weights cast back to the input's dtype (Granite)

    op = "moe_route"

    def describe(self) -> str:
        names = ("scoring", "topk_first", "renormalize", "renormalize_eps", "n_group", "topk_group", "scaling",
                 "keep_float")
        shown = ", ".join(f"{n}={v}" for n, v in zip(names, self.route, strict=True))
        return (f"top_k={self.top_k}, {shown}" + (f", bias={self.bias_buffer}" if self.bias_buffer else "")
                + ("; returns dense weights and indices" if self.dense else "")
                + ("; logits made fp32 after the linear layer, weights in the input's dtype" if self.upcast else ""))


def _frozen_vectors(module: nn.Module, experts: int) -> list[str]:
    """Own buffers, and parameters that take no gradient, of one value per expert: a correction bias
    (Laguna keeps its own as a frozen parameter)."""
    frozen = [(n, p) for n, p in module.named_parameters(recurse=False)
              if not p.requires_grad and n not in ("weight", "bias")]  # those two frozen: a frozen model's linear
    return [n for n, t in [*module.named_buffers(recurse=False), *frozen] if tuple(t.shape) == (experts,)]


def _router_params(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    frozen = set(_frozen_vectors(module, weight.shape[0])) if isinstance(weight, torch.Tensor) else set()
    if set(params) - {"weight", "bias"} - frozen or weight is None or weight.dim() != 2 or any(True for _ in module.children()):
        return None
    bias = params.get("bias")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        return None
    top_k = getattr(module, "top_k", None)
    if not isinstance(top_k, int) or not 1 <= top_k <= weight.shape[0] or not probe.one_tensor_forward(module):
        return None
    return weight, bias


def _route_candidates(module: nn.Module, experts: int) -> list[tuple[tuple, str | None]]:
    """(moe_route options after top_k, correction-bias buffer) worth probing for ``module``."""
    found: list[tuple[tuple, str | None]] = [
        (("softmax", False, renorm, 0.0, 1, 1, 1.0, keep), None)
        for renorm, keep in itertools.product((True, False), (False, True))]
    found.append((("softmax", True, False, 0.0, 1, 1, 1.0, False), None))
    buffers = _frozen_vectors(module, experts)
    groups = getattr(module, "num_group", getattr(module, "n_group", 1))
    topk_group = getattr(module, "topk_group", 1)
    scaling = getattr(module, "routed_scaling_factor", 1.0)
    if not (isinstance(groups, int) and isinstance(topk_group, int) and isinstance(scaling, (int, float))):
        groups, topk_group, scaling = 1, 1, 1.0
    for buffer, (renorm, eps) in itertools.product([*buffers[:1], None], ((True, 1e-20), (True, 0.0), (False, 0.0))):
        found.append((("sigmoid", False, renorm, eps, groups, topk_group, float(scaling), False), buffer))
    return found


def _logits(module: nn.Module, plan: RouterPlan, x: torch.Tensor) -> torch.Tensor:
    h = x.reshape(-1, module.weight.shape[1]) if plan.flatten else x
    if plan.fp32_logits:
        return F.linear(h.float(), module.weight.float())
    logits = F.linear(h, module.weight, module.bias if "bias" in module._parameters else None)
    return logits.float() if plan.upcast else logits


def _route(module: nn.Module, plan: RouterPlan, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    logits = _logits(module, plan, x)
    bias = getattr(module, plan.bias_buffer) if plan.bias_buffer else None
    scoring, topk_first, renorm, eps, groups, topk_group, scaling, keep = plan.route
    weights, indices = moe_route_op.OP(logits, plan.top_k, scoring, topk_first, renorm, eps, bias, groups, topk_group,
                                       scaling, keep)
    if plan.dense:
        return torch.zeros_like(logits).scatter(1, indices, weights), indices
    return logits, weights.to(x.dtype) if plan.upcast else weights, indices


def _unfit_router(module: nn.Module, twin: nn.Module, flat: Any, x: torch.Tensor) -> str | None:
    """None where ``flat`` is a router's result, (logits, weights, indices) or (dense weights, indices),
    that one call reproduces; else why no variant of ``moe_route`` can be its forward ("" where it is
    no router's result at all)."""
    if not (isinstance(flat, tuple) and len(flat) in (2, 3) and all(isinstance(t, torch.Tensor) for t in flat)):
        return ""
    if not probe.same(flat, probe.attempt(type(module).forward, twin, x)):
        return ("a router whose forward draws random numbers (two calls on one input differ: it samples its experts "
                f"in {'training' if module.training else 'this'} mode, as PhiMoE's sparsemixer does); moe_route's "
                "variants are deterministic")
    return None


def match_router(module: nn.Module) -> RouterPlan | LeftAlone | None:
    found = _router_params(module)
    if found is None:
        return None
    weight, bias = found
    if probe.is_meta(module):
        return LeftAlone("parameters on the meta device: no probe can confirm the forward")
    twin = probe.with_random_parameters(module, center=0.0)
    # small logits: probabilities far from 0 and 1, so that renormalising or not parts even in bf16
    x = probe.randn(2, PROBE_TOKENS, weight.shape[1], dtype=weight.dtype, device=weight.device, scale=0.1)
    flat = probe.attempt(type(module).forward, twin, x.reshape(-1, weight.shape[1]))
    unfit = _unfit_router(module, twin, flat, x.reshape(-1, weight.shape[1]))
    if unfit is not None:
        return LeftAlone(unfit) if unfit else None
    batched = probe.attempt(type(module).forward, twin, x)
    flatten = isinstance(batched, tuple) and probe.same(batched, flat)
    dense = len(flat) == 2
    modes = ((False, False), (True, False)) + (((False, True),) if weight.dtype != torch.float32 else ())
    for (fp32, upcast), (route, buffer) in itertools.product(modes, _route_candidates(module, weight.shape[0])):
        if fp32 and bias is not None:
            continue
        plan = RouterPlan(module.top_k, fp32, flatten, route, buffer, weight.dtype, dense, upcast)
        if probe.same(flat, probe.attempt(_route, twin, plan, x.reshape(-1, weight.shape[1]))):
            return plan
    if dense:
        shapes = ", ".join(str(tuple(t.shape)) for t in flat)
        return LeftAlone(f"a router by its weight and top_k, but its forward returns 2 tensors of shapes {shapes}, "
                         "neither (logits, weights, indices) nor (weights scattered per expert, indices) of a variant "
                         "of moe_route: its block takes per-expert scores the ops do not give")
    return LeftAlone("a router by its weight and top_k, but no variant of moe_route reproduces its forward bit for bit")


def replace_router(module: nn.Module, plan: RouterPlan):
    original = runtime.own_forward(module)

    def forward(hidden_states, *args, **kwargs):
        if (args or kwargs or module.weight.dtype != plan.dtype or hidden_states.dtype != plan.dtype
                or (hidden_states.dim() != 2 and not plan.flatten)):
            runtime.declined("moe_route", hidden_states, "arguments, a rank or a dtype the probe did not confirm: "
                             "the module's own forward ran")
            return original(hidden_states, *args, **kwargs)
        runtime.routing("moe_route", hidden_states)
        return _route(module, plan, hidden_states)

    return forward


RULES = [PatchRule("moe_router", match_router, replace_router, ops=("moe_route",),
                   description="mixture-of-experts routers: a linear layer, then softmax or sigmoid and top-k")]
