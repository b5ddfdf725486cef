"""The same functions as other implementations run them: Inductor, Liger-Kernel, QuACK (None where absent)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native.tools.bench.rows import Inputs, groups_of, torch_function


def _liger(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    try:
        if op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            # offset 0, Llama casting, not in place (in place would overwrite dy between runs).
            return lambda i: LigerRMSNormFunction.apply(i.x, i.w, 1e-6, 0.0, "llama", False)
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return lambda i: LigerLayerNormFunction.apply(i.x, i.w, i.b, 1e-5)
        if op == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            return lambda i: LigerSoftmaxFunction.apply(i.x)
        if op in ("group_norm", "group_norm_cl"):
            from liger_kernel.ops.group_norm import LigerGroupNormFunction

            return lambda i: LigerGroupNormFunction.apply(i.x, i.w, i.b, i.x.shape[1], groups_of(i.x.shape[1]), 1e-5)
    except ImportError:
        return None
    return None


def _quack(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    try:
        if op == "rms_norm":
            from quack.rmsnorm import rmsnorm

            return lambda i: rmsnorm(i.x, i.w, eps=1e-6)
        if op == "softmax":
            from quack.softmax import softmax

            return lambda i: softmax(i.x)
    except ImportError:
        return None
    return None


def competitors(op: str, inductor: bool) -> dict[str, Callable[[Inputs], torch.Tensor] | None]:
    """Other implementations of the same function: None where absent (printed as "–")."""
    compiled = None
    if inductor:
        # Each row compiles its own graph: past Dynamo's recompile limit a shared function would
        # silently run eagerly, and its column would report aten's time as Inductor's.
        torch._dynamo.reset()
        compiled = torch.compile(torch_function(op), dynamic=False)
    return {"inductor_ms": compiled, "liger_ms": _liger(op), "quack_ms": _quack(op)}
