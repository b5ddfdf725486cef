"""The Triton op library: one module per op family, each listing its overrides."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OverrideSpec:
    """One override: the aten op symbol it replaces, its cond and its impl."""

    op: str
    cond: Callable[..., bool]
    impl: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def planned(cls, op: str, cond: Callable[..., Any], impl: Callable[..., Any]) -> OverrideSpec:
        """An override whose cond returns its launch plan (None to decline) and whose impl takes
        it as ``plan=``: the layout work of a call is done once, in the cond."""
        return cls(op, cond, impl, {"impl_takes_plan": True})


# Families the last ``all_overrides()`` left out, with why (the status report shows them).
SKIPPED: dict[str, str] = {}


def _has_kernel(op: str, key: str) -> bool:
    import torch

    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{op}", key)


def all_overrides() -> list[OverrideSpec]:
    """Every override of the library (op modules are light: no triton import).

    A family is installed whole or not at all: an override needs a kernel at the dispatch key to
    fall back to. On CPU builds ``_fused_rms_norm_backward`` has none, and overriding only the
    forward there would route ``F.rms_norm``'s backward to that missing kernel.
    """
    from python_native_dsls.triton import dispatch_key

    from . import _layout, activations, bmm, layer_norm, rms_norm, softmax

    _layout.backend_device.cache_clear()
    key = dispatch_key()
    families = [layer_norm, rms_norm, softmax, activations, bmm]
    SKIPPED.clear()
    specs = []
    for family in families:
        missing = next((s.op for s in family.OVERRIDES if not _has_kernel(s.op, key)), None)
        if missing is None:
            specs += family.OVERRIDES
        else:
            SKIPPED[family.__name__.rpartition(".")[2]] = f"aten::{missing} has no kernel at {key} to fall back to"
    return specs

