"""The Triton op library: one module per op family, each declaring its ``FAMILY``.

Every family is a ``python_native_dsls.family.Family``: its conds, explanations, plan caches and
guarded kernel loader are built from its declaration, none written here or in the op modules.
"""

from __future__ import annotations

from python_native_dsls.family import Family, installable
from python_native_dsls.spec import OverrideSpec

from ..target import dispatch_key

__all__ = ["SKIPPED", "OverrideSpec", "all_overrides", "families"]


# Families the last ``all_overrides()`` left out, and ops registration left out (unmeasured ones at a GPU
# key: ``dsl_support.register_specs``), with why (the status report shows them).
SKIPPED: dict[str, str] = {}


def families() -> list[Family]:
    """Every family of the library, declared or not installable here (op modules are light: no triton import)."""
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
        moe,
        reductions,
        rms_norm,
        rotary,
        scatter_add,
        softmax,
        topk,
    )

    modules = [layer_norm, rms_norm, softmax, activations, bmm, group_norm, dropout, reductions, topk, scatter_add,
               linear_cross_entropy, model_rms_norm, gated, rotary, model_activations, moe]
    return [m.FAMILY for m in modules]


def all_overrides() -> list[OverrideSpec]:
    """Every override of the library installable at this backend's key (``family.installable``)."""
    from ..plans import layout

    layout.backend_device.cache_clear()
    SKIPPED.clear()
    return installable(families(), dispatch_key(), SKIPPED)
