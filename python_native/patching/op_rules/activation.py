"""The activation rule: hand-written activation modules to ``gelu_tanh`` or ``quick_gelu``
(``python_native/ops/activation_op.py``).

A candidate is a module without parameters or children whose forward (of one tensor) is not
torch's own. The probe runs it on values across the activation's curve; where its output equals
an op's reference bit for bit (the tanh-GELU of GPT-2's ``NewGELUActivation``, QuickGELU), the
module is routed to the op for the input dtypes confirmed. A module that computes nearly the same
by another formula (``FastGELUActivation``'s factored polynomial) is reported and left alone: the
op would change its results.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from python_native.ops import activation_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

OPS = {"gelu_tanh": activation_op.GELU_TANH, "quick_gelu": activation_op.QUICK_GELU}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 30  # after the rules of modules with parameters


@dataclasses.dataclass(frozen=True)
class ActivationPlan:
    op: str
    dtypes: frozenset

    def describe(self) -> str:
        return self.op


def match_activation(module: nn.Module) -> ActivationPlan | LeftAlone | None:
    if (any(True for _ in module.parameters()) or any(True for _ in module.children())
            or probe.torch_module(module) or not probe.one_tensor_forward(module)):
        return None
    forward = type(module).forward
    x = probe.randn(4, 64, scale=3.0)
    wanted = probe.attempt(forward, module, x)
    if not isinstance(wanted, torch.Tensor) or probe.same(wanted, F.gelu(x, approximate="tanh")):
        return None  # not an activation of ours, or aten's gelu (its overrides serve it as it stands)
    for name, op in OPS.items():
        if probe.same(wanted, probe.attempt(op, x)):
            dtypes = frozenset(dt for dt in DTYPES if probe.same(probe.attempt(forward, module, x.to(dt)),
                                                                 probe.attempt(op, x.to(dt))))
            return ActivationPlan(name, dtypes)
    for name, op in OPS.items():
        if probe.close(wanted, probe.attempt(op, x), rtol=1e-3, atol=1e-4):
            diff = (wanted - op(x)).abs().max().item()
            return LeftAlone(f"computes {name} by another formula (differs by up to {diff:.1e}): the op would change its results")
    return None


def replace_activation(module: nn.Module, plan: ActivationPlan):
    original = runtime.own_forward(module)
    op, name, dtypes = OPS[plan.op], plan.op, plan.dtypes

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dtype not in dtypes:
            runtime.declined(name, x, f"input dtype {x.dtype} or arguments the probe did not confirm: "
                             "the module's own forward ran")
            return original(x, *args, **kwargs)
        runtime.routing(name, x)
        return op(x)

    return forward


RULES = [PatchRule("activation", match_activation, replace_activation, ops=("gelu_tanh", "quick_gelu"),
                   description="hand-written activations (tanh-GELU, QuickGELU)")]
