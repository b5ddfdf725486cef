"""The RMSNorm rule: hand-written RMSNorm modules to ``rms_norm`` (``python_native/ops/rms_norm_op.py``).

``rms_norm`` takes a module with one 1-D parameter (whatever its name: ``weight``, ``w``, ``scale``,
``gamma``) or none, no children and a forward of one tensor, whose forward equals
``python_native::rms_norm``'s reference bit for bit in one of its casting modes (the weight after
the cast back, Llama; ``(1 + weight)`` in fp32, Gemma; the weight in fp32, Olmo2; with an ``eps``
the probe finds among the module's float attributes). A weightless RMSNorm is routed with a weight
of ones in the input's dtype, which multiplies the cast-back norm exactly. The same
modules serve as q/k norms over the head dim of 4-D tensors and as post-norms; the op normalises
the last dim of any rank. It probes each input dtype and routes only those it confirmed.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from python_native.ops import rms_norm_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

MODES = ((0.0, False), (1.0, True), (0.0, True), (1.0, False))  # (offset, weight_in_fp32)
USUAL_EPS = (1e-6, 1e-5, 1e-8, 1e-12)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 80  # tried first: the most specific rule (one weight, a bit-for-bit probe)


@dataclasses.dataclass(frozen=True)
class NormPlan:
    eps: float
    offset: float
    weight_in_fp32: bool
    dtypes: frozenset  # input dtypes the probe confirmed
    weight: str | None = "weight"  # the parameter's name; None: a weightless norm

    def describe(self) -> str:
        only = "" if self.dtypes >= set(DTYPES) else f"; {_only(self.dtypes)}"
        if self.weight is None:
            return f"eps={self.eps:g}, no weight{only}"
        where = "(offset + weight) in fp32" if self.weight_in_fp32 else "weight after the cast back"
        named = "" if self.weight == "weight" else f", weight={self.weight}"
        return f"eps={self.eps:g}, offset={self.offset:g}, {where}{named}{only}"


def _only(dtypes: frozenset) -> str:
    """The input dtypes a plan routes, where its probe confirmed fewer than all (the rest run the module)."""
    names = [str(d).removeprefix("torch.") for d in DTYPES if d in dtypes]
    return f"{', '.join(names)} inputs only" if names else "no input dtype confirmed"


def _one_weight(module: nn.Module) -> tuple[str | None, torch.Tensor | None] | None:
    """(name, parameter) of a module's one 1-D parameter, (None, None) for a module without any;
    None for any other module (children, several parameters, another rank)."""
    if any(True for _ in module.children()):
        return None
    params = [(n, p) for n, p in module._parameters.items() if p is not None]
    if not params:
        return None, None
    return params[0] if len(params) == 1 and params[0][1].dim() == 1 else None


def _sizes(module: nn.Module, weight: torch.Tensor | None) -> list[int]:
    """Row widths to probe: the weight's, else a width of the module's own (``hidden_size``) and 16."""
    if weight is not None:
        return [weight.shape[0]]
    own = [v for k, v in vars(module).items() if type(v) is int and not k.startswith("_") and 1 < v <= 1 << 14]
    return list(dict.fromkeys([*own[:1], 16]))


def _own_eps(module: nn.Module) -> list[float]:
    return [v for k, v in vars(module).items() if isinstance(v, float) and not k.startswith("_") and 0 < v < 1e-1]


def _eps_candidates(module: nn.Module) -> list[float]:
    return list(dict.fromkeys([*_own_eps(module), *USUAL_EPS]))


def _ones(x: torch.Tensor) -> torch.Tensor:
    return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)


def _reference(twin: nn.Module, eps: float, offset: float, in_fp32: bool, name: str | None = "weight"):
    if name is None:
        return lambda x: rms_norm_op.OP(x, _ones(x), eps, 0.0, False)
    return lambda x: rms_norm_op.OP(x, getattr(twin, name), eps, offset, in_fp32)


def _confirmed(forward, twin: nn.Module, candidate, x: torch.Tensor) -> frozenset:
    """The input dtypes for which ``candidate`` computes what the module's forward computes."""
    return frozenset(dt for dt in DTYPES if probe.same(probe.attempt(forward, twin, x.to(dt)),
                                                       probe.attempt(candidate, x.to(dt))))


def match_rms_norm(module: nn.Module) -> NormPlan | LeftAlone | None:
    found = _one_weight(module)
    if found is None or probe.torch_module(module) or not probe.one_tensor_forward(module):
        return None
    name, weight = found
    if weight is None and not _own_eps(module):  # a weightless norm still keeps its eps
        return None
    if weight is not None and weight.is_meta:
        return LeftAlone("parameters on the meta device: no probe can confirm the forward")
    twin = probe.with_random_parameters(module)
    forward = type(module).forward
    for size in _sizes(module, weight):
        device = "cpu" if weight is None else weight.device
        probes = [probe.randn(2, 3, size, device=device, scale=s) for s in (1.0, 1e-3)]  # the small one tells eps
        wanted = [probe.attempt(forward, twin, x) for x in probes]
        if all(isinstance(w, torch.Tensor) for w in wanted):
            return _plan(module, twin, name, probes, wanted)
    return None


def _plan(module: nn.Module, twin: nn.Module, name: str | None, probes: list, wanted: list) -> NormPlan | LeftAlone | None:
    """The casting mode and eps that reproduce ``wanted`` bit for bit, or why none does."""
    forward = type(module).forward
    modes = MODES if name is not None else MODES[:1]  # without a weight, the modes compute alike
    for eps in _eps_candidates(module):
        plans = [NormPlan(eps, offset, in_fp32, _confirmed(forward, twin, _reference(twin, eps, offset, in_fp32, name),
                                                           probes[0]), name)
                 for offset, in_fp32 in modes
                 if all(probe.same(w, probe.attempt(_reference(twin, eps, offset, in_fp32, name), x))
                        for w, x in zip(wanted, probes, strict=True))]
        if plans:  # modes that agree in fp32 may part in half precision: the one confirmed for most dtypes
            return max(plans, key=lambda plan: len(plan.dtypes))
    weight = None if name is None else getattr(twin, name).float()
    if probe.close(wanted[0], F.rms_norm(probes[0], probes[0].shape[-1:], weight, _eps_candidates(module)[0])):
        return LeftAlone("an RMSNorm, but no casting mode of rms_norm reproduces it bit for bit")
    return None


def replace_rms_norm(module: nn.Module, plan: NormPlan):
    original = runtime.own_forward(module)
    eps, offset, in_fp32, dtypes, name = plan.eps, plan.offset, plan.weight_in_fp32, plan.dtypes, plan.weight
    op = rms_norm_op.OP

    def forward(hidden_states, *args, **kwargs):
        if args or kwargs or hidden_states.dtype not in dtypes:
            why = ("arguments besides the input" if args or kwargs else
                   f"input {hidden_states.dtype} {tuple(hidden_states.shape)}: a dtype the probe did not confirm")
            runtime.declined("rms_norm", hidden_states, f"{why}: the module's own forward ran")
            return original(hidden_states, *args, **kwargs)
        runtime.routing("rms_norm", hidden_states)
        if name is None:
            return op(hidden_states, _ones(hidden_states), eps, 0.0, False)
        return op(hidden_states, getattr(module, name), eps, offset, in_fp32)

    return forward


RULES = [PatchRule("rms_norm", match_rms_norm, replace_rms_norm, ops=("rms_norm",),
                   description="hand-written RMSNorm modules (every casting mode, any weight name or none, q/k norms, "
                               "post-norms)")]
