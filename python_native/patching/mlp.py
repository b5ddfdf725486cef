"""The gated-MLP rule: ``down(act(gate(x)) * up(x))`` to ``swiglu`` or ``geglu``.

A candidate has two or three ``nn.Linear`` children and otherwise only children without
parameters (its activation, a dropout), and a forward of one tensor:

- three projections: gate and up (hidden -> inner) and down (inner -> hidden);
- two projections: a fused ``gate_up`` (hidden -> 2 * inner) whose output the forward splits with
  ``chunk(2, -1)``, and down. The op takes the two halves as they are (row-strided views).

Which projection plays which part, which half of a fused projection is the gate, and which
activation the module applies (SiLU, GELU, tanh-GELU) are all found by the probe: the first
assignment whose replacement reproduces the module's forward bit for bit wins. The projections
are called as modules (their hooks run), looked up by name on every call.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from python_native.ops import gated_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

ACTIVATIONS = (("swiglu", ()), ("geglu", ("none",)), ("geglu", ("tanh",)))


@dataclasses.dataclass(frozen=True)
class MlpPlan:
    op: str  # "swiglu" or "geglu"
    options: tuple  # geglu's approximation
    gate: str  # the child that computes the gate (the fused projection when ``up`` is None)
    up: str | None
    down: str
    gate_first: bool  # fused: the gate is the first half of the chunk

    def describe(self) -> str:
        act = self.op + (f"({self.options[0]})" if self.options else "")
        if self.up is None:
            halves = "gate, up" if self.gate_first else "up, gate"
            return f"{act}; {self.gate}.chunk(2) -> ({halves}); {self.down}"
        return f"{act}; gate={self.gate}, up={self.up}, down={self.down}"


def _op(plan_op: str):
    return gated_op.SWIGLU if plan_op == "swiglu" else gated_op.GEGLU


def _compute(module: nn.Module, plan: MlpPlan, x: torch.Tensor) -> torch.Tensor:
    if plan.up is None:
        first, second = getattr(module, plan.gate)(x).chunk(2, dim=-1)
        gate, up = (first, second) if plan.gate_first else (second, first)
    else:
        gate = getattr(module, plan.gate)(x)
        up = getattr(module, plan.up)(x)
    return getattr(module, plan.down)(_op(plan.op)(gate, up, *plan.options))


def _assignments(linears: dict[str, nn.Linear]):
    """(gate, up, down, gate_first) for every role assignment the shapes allow."""
    names = list(linears)
    if len(names) == 3:
        for gate, up, down in itertools.permutations(names):
            g, u, d = linears[gate], linears[up], linears[down]
            if g.weight.shape == u.weight.shape and d.weight.shape == g.weight.shape[::-1]:
                yield gate, up, down, True
    elif len(names) == 2:
        for fused, down in itertools.permutations(names):
            f, d = linears[fused].weight.shape, linears[down].weight.shape
            if f[0] == 2 * d[1] and f[1] == d[0]:
                yield fused, None, down, True
                yield fused, None, down, False


def match_gated_mlp(module: nn.Module) -> MlpPlan | LeftAlone | None:
    children = dict(module.named_children())
    linears = {n: c for n, c in children.items() if isinstance(c, nn.Linear)}
    others = [c for n, c in children.items() if n not in linears]
    if (len(linears) not in (2, 3) or any(True for c in others for _ in c.parameters())
            or any(True for _ in module.parameters(recurse=False)) or not probe.one_tensor_forward(module)):
        return None
    candidates = list(_assignments(linears))
    if not candidates:
        return None
    if probe.is_meta(module):
        return LeftAlone("parameters on the meta device: no probe can confirm the forward")
    weight = linears[candidates[0][0]].weight
    x = probe.randn(2, 3, weight.shape[1], dtype=weight.dtype, device=weight.device)
    wanted = probe.attempt(type(module).forward, module, x)
    if not isinstance(wanted, torch.Tensor):
        return None
    for (gate, up, down, gate_first), (op, options) in itertools.product(candidates, ACTIVATIONS):
        plan = MlpPlan(op, options, gate, up, down, gate_first)
        if linears[gate].weight.shape[1] == weight.shape[1] and probe.same(wanted, probe.attempt(_compute, module, plan, x)):
            return plan
    return LeftAlone("a gated MLP by its projections, but no activation of swiglu/geglu reproduces its forward bit for bit")


def replace_gated_mlp(module: nn.Module, plan: MlpPlan):
    original = runtime.own_forward(module)

    def forward(x, *args, **kwargs):
        if args or kwargs:
            runtime.declined(plan.op, x, "arguments the probe did not confirm: the module's own forward ran")
            return original(x, *args, **kwargs)
        runtime.routing(plan.op, x)
        return _compute(module, plan, x)

    return forward


RULES = [PatchRule("gated_mlp", match_gated_mlp, replace_gated_mlp, ops=("swiglu", "geglu"),
                   description="gated MLPs (separate gate and up projections, or a fused gate_up split by chunk)")]
