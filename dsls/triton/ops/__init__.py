"""The Triton op library: one module per op family, each listing its overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class OverrideSpec:
    """One override: the aten op symbol it replaces, its cond and its impl."""

    op: str
    cond: Callable[..., bool]
    impl: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)


def all_overrides() -> list[OverrideSpec]:
    """Every override of the library (op modules are light: no triton import)."""
    return []
