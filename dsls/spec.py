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
    """One override: the aten op symbol it replaces, its cond and its impl."""

    op: str
    cond: Callable[..., bool]
    impl: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    measured: bool = True
    """False until a GPU has timed the op: at the CUDA key it stays off where no calibration table covers it."""

    @classmethod
    def planned(cls, op: str, cond: Callable[..., Any], impl: Callable[..., Any], *, measured: bool = True,
                **options: Any) -> OverrideSpec:
        """An override whose cond returns its launch plan (None to decline) and whose impl takes
        it as ``plan=``: the layout work of a call is done once, in the cond. ``options`` are
        further registration options (``derive_variants``)."""
        return cls(op, cond, impl, {"impl_takes_plan": True, **options}, measured)


def has_kernel(op: str, key: str) -> bool:
    """Whether ``aten::op`` has a kernel at dispatch key ``key`` for an override to fall back to."""
    import torch

    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{op}", key)
