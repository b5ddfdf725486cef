"""The same functions as other implementations run them: Inductor, Liger-Kernel, QuACK (None where absent)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from python_native.tools.bench.rows import Inputs, formula, torch_function


def _liger(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    try:
        if op in ("rms_norm", "rms_norm_llama", "rms_norm_gemma"):
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            # Llama casting with offset 0, or Gemma's (1 + weight in fp32); not in place (in place
            # would overwrite dy between runs).
            if op == "rms_norm_gemma":
                return lambda i: LigerRMSNormFunction.apply(i.x, i.w, 1e-6, 1.0, "gemma", False)
            return lambda i: LigerRMSNormFunction.apply(i.x, i.w, 1e-6, 0.0, "llama", False)
        model = _liger_model_op(op)
        if model is not None:
            return model
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return lambda i: LigerLayerNormFunction.apply(i.x, i.w, i.b, 1e-5)
        if op == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            return lambda i: LigerSoftmaxFunction.apply(i.x)
        if op in ("group_norm", "group_norm_cl"):
            from liger_kernel.ops.group_norm import LigerGroupNormFunction

            return lambda i: LigerGroupNormFunction.apply(i.x, i.w, i.b, i.x.shape[1], i.named["groups"], 1e-5)
    except ImportError:
        return None
    return None


def _gate_up(i: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    named = i.named
    return named["gate_up"].chunk(2, -1) if "gate_up" in named else (named["gate"], named["up"])


def _liger_model_op(op: str) -> Callable[[Inputs], object] | None:
    """Liger-Kernel's equivalents of the custom ops' rows (ImportError where it is absent).

    Liger's gated kernels make their inputs contiguous first (a copy of each half of a fused
    gate_up) and its rotary kernel rotates q and k in place; both are timed as users call them."""
    if op in ("swiglu", "swiglu_chunked"):
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return lambda i: LigerSiLUMulFunction.apply(*_gate_up(i))
    if op == "geglu":  # Liger's GeGLU is the tanh approximation, as the row
        from liger_kernel.ops.geglu import LigerGELUMulFunction

        return lambda i: LigerGELUMulFunction.apply(*_gate_up(i))
    if op == "rotary":
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        return lambda i: liger_rotary_pos_emb(i.named["q"], i.named["k"], i.named["cos"], i.named["sin"])
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
        compiled = torch.compile(formula(op) or torch_function(op), dynamic=False)
    return {"inductor_ms": compiled, "liger_ms": _liger(op), "quack_ms": _quack(op)}
