"""The Triton op library: one module per op family, each listing its overrides."""

from __future__ import annotations

from python_native_dsls.spec import OverrideSpec, has_kernel

from ..target import dispatch_key

__all__ = ["FAMILY_OF", "SKIPPED", "OverrideSpec", "all_overrides"]


# Families the last ``all_overrides()`` left out, with why (the status report shows them).
SKIPPED: dict[str, str] = {}
# The family of every op the last ``all_overrides()`` listed.
FAMILY_OF: dict[str, str] = {}


def all_overrides() -> list[OverrideSpec]:
    """Every override of the library (op modules are light: no triton import).

    A family is installed whole or not at all: an override needs a kernel at the dispatch key to
    fall back to. On CPU builds ``_fused_rms_norm_backward`` has none, and overriding only the
    forward there would route ``F.rms_norm``'s backward to that missing kernel.
    """
    from ..plans import layout
    from . import activations, bmm, dropout, group_norm, layer_norm, rms_norm, softmax

    layout.backend_device.cache_clear()
    key = dispatch_key()
    families = [layer_norm, rms_norm, softmax, activations, bmm, group_norm, dropout]
    SKIPPED.clear()
    FAMILY_OF.clear()
    specs = []
    for family in families:
        name = family.__name__.rpartition(".")[2]
        missing = next((s.op for s in family.OVERRIDES if not has_kernel(s.op, key)), None)
        if missing is None:
            specs += family.OVERRIDES
            FAMILY_OF.update((s.op, name) for s in family.OVERRIDES)
        else:
            SKIPPED[name] = f"aten::{missing} has no kernel at {key} to fall back to"
    return specs


def note_left_out(ops: dict[str, str]) -> None:
    """Record in ``SKIPPED``, under their families, the ops registration left out (op -> why)."""
    by_family: dict[str, list[str]] = {}
    for op, why in ops.items():
        by_family.setdefault(FAMILY_OF.get(op, op), []).append(f"{op}: {why}")
    for family, reasons in by_family.items():
        SKIPPED[family] = "; ".join(reasons)

