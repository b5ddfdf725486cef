"""What a backend's op library declares, and the fallback check both backends make before installing it.

Backend-neutral and light (no DSL import): the op modules of every backend list ``OverrideSpec``s,
and ``python_native.dsl_support.register_specs`` installs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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


def has_kernel(op: str, key: str) -> bool:
    """Whether ``aten::op`` has a kernel at dispatch key ``key`` for an override to fall back to."""
    import torch

    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{op}", key)


@contextlib.contextmanager
def runtime_import(dsl: str) -> Iterator[None]:
    """Around an impl's lazy import of its kernels, which imports the DSL's runtime (triton,
    cutlass) the first time: an import that raises makes the DSL unavailable, routes its calls to
    aten from then on, records why for the status report, and hands this call on as well."""
    try:
        yield
    except Exception as e:
        from python_native import codegen, dsl_support

        if isinstance(e, codegen.OverrideUnavailable):
            raise
        raise dsl_support.runtime_failed(dsl, e) from e
