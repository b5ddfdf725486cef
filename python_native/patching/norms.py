"""The norm rules: hand-written RMSNorm modules to ``rms_norm``; LayerNorms recognised and reported.

``rms_norm`` takes a module with one 1-D ``weight`` parameter, no children and a forward of one
tensor, whose forward equals ``python_native::rms_norm``'s reference bit for bit in one of its
casting modes (the weight after the cast back, Llama; ``(1 + weight)`` in fp32, Gemma; the weight
in fp32, Olmo2; with an ``eps`` the probe finds among the module's float attributes). The same
modules serve as q/k norms over the head dim of 4-D tensors and as post-norms; the op normalises
the last dim of any rank. It probes each input dtype and routes only those it confirmed.

``layer_norm`` takes nothing: it recognises ``nn.LayerNorm`` subclasses with a forward of their own
and hand-written LayerNorms, and says in the report what serves them (aten's layer-norm overrides
where the forward calls ``F.layer_norm``) or why none of the declared ops can.
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


@dataclasses.dataclass(frozen=True)
class NormPlan:
    eps: float
    offset: float
    weight_in_fp32: bool
    dtypes: frozenset  # input dtypes the probe confirmed

    def describe(self) -> str:
        where = "(offset + weight) in fp32" if self.weight_in_fp32 else "weight after the cast back"
        return f"eps={self.eps:g}, offset={self.offset:g}, {where}"


def _is_torch_module(module: nn.Module) -> bool:
    """torch's own modules call aten ops that the overrides serve as they stand."""
    return type(module).forward.__module__.startswith("torch.")


def _one_weight(module: nn.Module) -> torch.Tensor | None:
    params = dict(module.named_parameters(recurse=False))
    if list(params) != ["weight"] or params["weight"].dim() != 1 or any(True for _ in module.children()):
        return None
    return params["weight"]


def _eps_candidates(module: nn.Module) -> list[float]:
    own = [v for k, v in vars(module).items() if isinstance(v, float) and not k.startswith("_") and 0 < v < 1e-1]
    return list(dict.fromkeys([*own, *USUAL_EPS]))


def _reference(twin: nn.Module, eps: float, offset: float, in_fp32: bool):
    return lambda x: rms_norm_op.OP(x, twin.weight, eps, offset, in_fp32)


def _confirmed(forward, twin: nn.Module, candidate, x: torch.Tensor) -> frozenset:
    """The input dtypes for which ``candidate`` computes what the module's forward computes."""
    return frozenset(dt for dt in DTYPES if probe.same(probe.attempt(forward, twin, x.to(dt)),
                                                       probe.attempt(candidate, x.to(dt))))


def match_rms_norm(module: nn.Module) -> NormPlan | LeftAlone | None:
    weight = _one_weight(module)
    if weight is None or _is_torch_module(module) or not probe.one_tensor_forward(module):
        return None
    if weight.is_meta:
        return LeftAlone("parameters on the meta device: no probe can confirm the forward")
    twin = probe.with_random_parameters(module)
    forward = type(module).forward
    size = weight.shape[0]
    probes = [probe.randn(2, 3, size, device=weight.device, scale=s) for s in (1.0, 1e-3)]  # the small one tells eps
    wanted = [probe.attempt(forward, twin, x) for x in probes]
    if not all(isinstance(w, torch.Tensor) for w in wanted):
        return None
    for eps in _eps_candidates(module):
        plans = [NormPlan(eps, offset, in_fp32, _confirmed(forward, twin, _reference(twin, eps, offset, in_fp32), probes[0]))
                 for offset, in_fp32 in MODES
                 if all(probe.same(w, probe.attempt(_reference(twin, eps, offset, in_fp32), x))
                        for w, x in zip(wanted, probes, strict=True))]
        if plans:  # modes that agree in fp32 may part in half precision: the one confirmed for most dtypes
            return max(plans, key=lambda plan: len(plan.dtypes))
    if probe.close(wanted[0], F.rms_norm(probes[0], (size,), twin.weight.float(), _eps_candidates(module)[0])):
        return LeftAlone("an RMSNorm, but no casting mode of rms_norm reproduces it bit for bit")
    return None


def replace_rms_norm(module: nn.Module, plan: NormPlan):
    original = runtime.own_forward(module)
    eps, offset, in_fp32, dtypes = plan.eps, plan.offset, plan.weight_in_fp32, plan.dtypes
    op = rms_norm_op.OP

    def forward(hidden_states, *args, **kwargs):
        if args or kwargs or hidden_states.dtype not in dtypes:
            runtime.declined("rms_norm", hidden_states, f"input dtype {hidden_states.dtype} or arguments the probe "
                             "did not confirm: the module's own forward ran")
            return original(hidden_states, *args, **kwargs)
        runtime.routing("rms_norm", hidden_states)
        return op(hidden_states, module.weight, eps, offset, in_fp32)

    return forward


def match_layer_norm(module: nn.Module) -> LeftAlone | None:
    params = dict(module.named_parameters(recurse=False))
    subclass = isinstance(module, nn.LayerNorm) and type(module).forward is not nn.LayerNorm.forward
    if not subclass:
        weight = params.get("weight")
        if (weight is None or weight.dim() != 1 or set(params) - {"weight", "bias"} or any(True for _ in module.children())
                or _is_torch_module(module) or not probe.one_tensor_forward(module) or weight.is_meta):
            return None
        twin = probe.with_random_parameters(module)
        x = probe.randn(2, 3, weight.shape[0], device=weight.device)
        bias = twin._parameters.get("bias")
        if not probe.close(probe.attempt(type(module).forward, twin, x),
                           F.layer_norm(x, (weight.shape[0],), twin.weight.float(), None if bias is None else bias.float())):
            return None
    if "layer_norm" in type(module).forward.__code__.co_names:
        return LeftAlone("calls F.layer_norm: aten's layer-norm overrides serve it as it stands")
    return LeftAlone("a hand-written LayerNorm: no declared op computes it bit for bit (F.layer_norm rounds differently)")


def _no_replacement(module: nn.Module, plan: object):
    raise AssertionError("the layer_norm rule leaves every module alone")


RULES = [
    PatchRule("layer_norm", match_layer_norm, _no_replacement, ops=("layer_norm",),
              description="LayerNorm subclasses and hand-written LayerNorms: recognised and reported"),
    PatchRule("rms_norm", match_rms_norm, replace_rms_norm, ops=("rms_norm",),
              description="hand-written RMSNorm modules (every casting mode, q/k norms, post-norms)"),
]
