"""The layer-norm rule: LayerNorms recognised and reported, none routed.

It takes nothing: it recognises ``nn.LayerNorm`` subclasses with a forward of their own and
hand-written LayerNorms, and says in the report what serves them (aten's layer-norm overrides where
the forward calls ``F.layer_norm``) or why none of the custom ops can. Its op is aten's
``layer_norm``; no custom op stands beside it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from python_native.patching import probe
from python_native.patching.rules import LeftAlone, PatchRule

PRIORITY = 70  # after rms_norm: a module that rule routes is no LayerNorm to report


def match_layer_norm(module: nn.Module) -> LeftAlone | None:
    params = dict(module.named_parameters(recurse=False))
    subclass = isinstance(module, nn.LayerNorm) and type(module).forward is not nn.LayerNorm.forward
    if not subclass:
        weight = params.get("weight")
        if (weight is None or weight.dim() != 1 or set(params) - {"weight", "bias"} or any(True for _ in module.children())
                or probe.torch_module(module) or not probe.one_tensor_forward(module) or weight.is_meta):
            return None
        twin = probe.with_random_parameters(module)
        x = probe.randn(2, 3, weight.shape[0], device=weight.device)
        bias = twin._parameters.get("bias")
        if not probe.close(probe.attempt(type(module).forward, twin, x),
                           F.layer_norm(x, (weight.shape[0],), twin.weight.float(), None if bias is None else bias.float())):
            return None
    if "layer_norm" in type(module).forward.__code__.co_names:
        return LeftAlone("calls F.layer_norm: aten's layer-norm overrides serve it as it stands")
    return LeftAlone("a hand-written LayerNorm: no custom op computes it bit for bit (F.layer_norm rounds differently)")


def _no_replacement(module: nn.Module, plan: object):
    raise AssertionError("the layer_norm rule leaves every module alone")


RULES = [PatchRule("layer_norm", match_layer_norm, _no_replacement, ops=("layer_norm",),
                   description="LayerNorm subclasses and hand-written LayerNorms: recognised and reported")]
