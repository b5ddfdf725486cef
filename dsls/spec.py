"""What a backend's op library declares, and the fallback check both backends make before installing it.

Backend-neutral and light (no DSL import): the op modules of every backend list ``OverrideSpec``s,
and ``python_native.dsl_support.register_specs`` installs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OverrideSpec:
    """One override: the aten op symbol it replaces, its cond, its impl and registration options.

    ``measured=False`` marks an override no GPU has timed against aten yet. Never slower than aten
    is the rule on GPUs, so at a GPU key it is installed only where a calibration table in force
    has evidence for it (``python_native.dsl_support.unmeasured_reason``); under Triton's
    interpreter (the CPU key) it is installed as any other.
    """

    op: str
    cond: Callable[..., bool]
    impl: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    measured: bool = True

    @classmethod
    def planned(
        cls, op: str, cond: Callable[..., Any], impl: Callable[..., Any], *, measured: bool = True, **options: Any
    ) -> OverrideSpec:
        """An override whose cond returns its launch plan (None to decline) and whose impl takes
        it as ``plan=``: the layout work of a call is done once, in the cond. ``options`` are
        further registration options (``derive_variants``, ``priority``)."""
        return cls(op, cond, impl, {"impl_takes_plan": True, **options}, measured)


def has_kernel(op: str, key: str) -> bool:
    """Whether ``aten::op`` has a kernel at dispatch key ``key`` for an override to fall back to."""
    import torch

    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{op}", key)
