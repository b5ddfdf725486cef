"""The CuTe DSL op library: one module per op family, each listing its overrides and the
specializations ``python -m python_native precompile`` builds ahead of time.

Op modules import neither cutlass nor the kernels; impls import ``python_native_dsls.cutedsl.kernels`` on their
first call. Row views come from ``python_native_dsls.layout`` (pure metadata checks, shared with the Triton
library).
"""

from __future__ import annotations

from python_native_dsls.spec import OverrideSpec, has_kernel

__all__ = ["SKIPPED", "OverrideSpec", "all_overrides", "families"]

# Ops registration left out here (unmeasured ones without GPU timings: ``dsl_support.register_specs``),
# with why (the status report shows them).
SKIPPED: dict[str, str] = {}


def families() -> list:
    from . import layer_norm, reductions, rms_norm, softmax

    return [rms_norm, softmax, layer_norm, reductions]


def all_overrides() -> list[OverrideSpec]:
    """Every override, a family only where aten has a CUDA kernel for each of its ops to fall back to."""
    SKIPPED.clear()
    return [
        spec
        for family in families()
        if all(has_kernel(s.op, "CUDA") for s in family.OVERRIDES)
        for spec in family.OVERRIDES
    ]


def precompile_variants() -> list[tuple[str, str, object]]:
    """``(op, size class, variant)`` for every declared specialization of every family."""
    return [entry for family in families() for entry in family.precompile_variants()]
