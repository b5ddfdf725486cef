"""The Triton op library: one module per op family, each listing its overrides."""

from __future__ import annotations

from python_native_dsls.spec import OverrideSpec, has_kernel

from ..target import dispatch_key

__all__ = ["SKIPPED", "OverrideSpec", "all_overrides"]


# Families the last ``all_overrides()`` left out, and ops registration left out (unmeasured ones at a GPU
# key: ``dsl_support.register_specs``), with why (the status report shows them).
SKIPPED: dict[str, str] = {}


def all_overrides() -> list[OverrideSpec]:
    """Every override of the library (op modules are light: no triton import).

    A family is installed whole or not at all: an override needs a kernel at the dispatch key to
    fall back to. On CPU builds ``_fused_rms_norm_backward`` has none, and overriding only the
    forward there would route ``F.rms_norm``'s backward to that missing kernel.
    """
    from ..plans import layout
    from . import (
        activations,
        bmm,
        dropout,
        gated,
        group_norm,
        layer_norm,
        linear_cross_entropy,
        model_activations,
        model_rms_norm,
        reductions,
        rms_norm,
        rotary,
        scatter_add,
        softmax,
        topk,
    )

    layout.backend_device.cache_clear()
    key = dispatch_key()
    families = [layer_norm, rms_norm, softmax, activations, bmm, group_norm, dropout, reductions, topk, scatter_add,
                linear_cross_entropy, model_rms_norm, gated, rotary, model_activations]
    SKIPPED.clear()
    specs = []
    for family in families:
        missing = next((f"{s.lib}::{s.op}" for s in family.OVERRIDES if not has_kernel(s.op, key, s.lib)), None)
        if missing is None:
            specs += family.OVERRIDES
        else:
            SKIPPED[family.__name__.rpartition(".")[2]] = f"{missing} has no kernel at {key} to fall back to"
    return specs

