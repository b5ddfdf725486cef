"""The gated-MLP rule: ``down(act(gate(x)) * up(x))`` to ``swiglu`` or ``geglu``
(``python_native/ops/gated_op.py``).

A candidate has two or three projections and otherwise only children without parameters (its
activation, a dropout), and a forward of one tensor. A projection is an ``nn.Linear`` or a wrapper
computing around one (``base_layer``: PEFT's LoRA layers), called as it is, so an adapter's delta,
its dropout and PEFT's switches (merged, disabled, the active adapter) stay the wrapper's own:

- three projections: gate and up (hidden -> inner) and down (inner -> hidden);
- two projections: a fused ``gate_up`` (hidden -> 2 * inner) whose output the forward splits with
  ``chunk(2, -1)``, and down. The op takes the two halves as they are (row-strided views).

Which projection plays which part, which half of a fused projection is the gate, and which
activation the module applies (SiLU, GELU, tanh-GELU) are all found by the probe: the first
assignment whose replacement reproduces the module's forward bit for bit wins (each run from the
same random state: a LoRA dropout in training mode draws the same mask in both). The projections
are called as modules (their hooks run) in the order the module calls them (gate, up, down: the
same random stream), looked up by name on every call. A forward that raises on the probe is left
alone, with the error.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import torch
from torch import nn

from python_native.ops import gated_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

ACTIVATIONS = (("swiglu", ()), ("geglu", ("none",)), ("geglu", ("tanh",)))
PRIORITY = 40  # after the norm and MoE rules, which take the more specific modules


@dataclasses.dataclass(frozen=True)
class MlpPlan:
    op: str  # "swiglu" or "geglu"
    options: tuple  # geglu's approximation
    gate: str  # the child that computes the gate (the fused projection when ``up`` is None)
    up: str | None
    down: str
    gate_first: bool  # fused: the gate is the first half of the chunk
    wrapped: tuple[str, ...] = ()  # projections that wrap their nn.Linear (LoRA), called as they are

    def describe(self) -> str:
        act = self.op + (f"({self.options[0]})" if self.options else "")
        if self.up is None:
            halves = "gate, up" if self.gate_first else "up, gate"
            roles = f"{act}; {self.gate}.chunk(2) -> ({halves}); {self.down}"
        else:
            roles = f"{act}; gate={self.gate}, up={self.up}, down={self.down}"
        if self.wrapped:
            roles += f"; {', '.join(self.wrapped)} wrap their Linear (adapters' deltas computed by the wrapper)"
        return roles


def _op(plan_op: str):
    return gated_op.SWIGLU if plan_op == "swiglu" else gated_op.GEGLU


def _is_dtensor(t: torch.Tensor) -> bool:
    """A DTensor (tensor parallelism that hands the projections' outputs on as DTensors)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return type(t) is not torch.Tensor and dtensor is not None and isinstance(t, dtensor.DTensor)


def _compute(module: nn.Module, plan: MlpPlan, x: torch.Tensor) -> torch.Tensor:
    if plan.up is None:
        first, second = getattr(module, plan.gate)(x).chunk(2, dim=-1)
        gate, up = (first, second) if plan.gate_first else (second, first)
    else:
        gate = getattr(module, plan.gate)(x)
        up = getattr(module, plan.up)(x)
    if _is_dtensor(gate):
        gated_op.register_dtensor_sharding()
    return getattr(module, plan.down)(_op(plan.op)(gate, up, *plan.options))


def _projection_weight(child: nn.Module) -> torch.Tensor | None:
    """The weight of a projection: an ``nn.Linear``'s, or that of the ``nn.Linear`` a wrapper computes
    around (``base_layer``, as PEFT's tuner layers keep it); None for any other module."""
    if isinstance(child, nn.Linear):
        return child.weight
    base, depth = getattr(child, "base_layer", None), 0
    while isinstance(base, nn.Module) and not isinstance(base, nn.Linear) and depth < 8:
        base, depth = getattr(base, "base_layer", None), depth + 1
    return base.weight if isinstance(base, nn.Linear) and probe.one_tensor_forward(child) else None


def _assignments(weights: dict[str, torch.Tensor]):
    """(gate, up, down, gate_first) for every role assignment the projections' shapes allow."""
    names = list(weights)
    shapes = {n: w.shape for n, w in weights.items()}
    if len(names) == 3:
        for gate, up, down in itertools.permutations(names):
            if shapes[gate] == shapes[up] and shapes[down] == shapes[gate][::-1]:
                yield gate, up, down, True
    elif len(names) == 2:
        for fused, down in itertools.permutations(names):
            f, d = shapes[fused], shapes[down]
            if f[0] == 2 * d[1] and f[1] == d[0]:
                yield fused, None, down, True
                yield fused, None, down, False


def _projections(module: nn.Module) -> dict[str, torch.Tensor] | None:
    """The projections' weights by child name, where ``module`` has the shape of a gated MLP."""
    children = dict(module.named_children())
    weights = {n: w for n, c in children.items() if (w := _projection_weight(c)) is not None}
    others = [c for n, c in children.items() if n not in weights]
    if (len(weights) not in (2, 3) or any(True for c in others for _ in c.parameters())
            or any(True for _ in module.parameters(recurse=False)) or not probe.one_tensor_forward(module)):
        return None
    return weights


def match_gated_mlp(module: nn.Module) -> MlpPlan | LeftAlone | None:
    weights = _projections(module)
    candidates = [] if weights is None else list(_assignments(weights))
    if not candidates:
        return None
    if probe.is_meta(module):
        return LeftAlone("parameters on the meta device: no probe can confirm the forward")
    weight = weights[candidates[0][0]]
    x = probe.randn(2, 3, weight.shape[1], dtype=weight.dtype, device=weight.device)
    wanted, error = probe.seeded(type(module).forward, module, x)
    if error is not None:
        return LeftAlone(f"a gated MLP by its projections, but its forward raised on a probe of shape {tuple(x.shape)}: "
                         f"{type(error).__name__}: {error}")
    if not isinstance(wanted, torch.Tensor):
        return None
    wrapped = tuple(n for n in weights if not isinstance(getattr(module, n), nn.Linear))
    errors = []
    for (gate, up, down, gate_first), (op, options) in itertools.product(candidates, ACTIVATIONS):
        plan = MlpPlan(op, options, gate, up, down, gate_first, wrapped)
        if weights[gate].shape[1] != weight.shape[1]:
            continue
        got, error = probe.seeded(_compute, module, plan, x)
        if probe.same(wanted, got):
            return plan
        errors.append(error)
    if errors and all(e is not None for e in errors):  # nothing to compare: say what failed
        return LeftAlone(f"a gated MLP by its projections, but the gated op raised on its probe: "
                         f"{type(errors[0]).__name__}: {errors[0]}")
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
