"""The CuTe DSL op library: one module per op family, each declaring its ``FAMILY`` and the
specializations ``python -m python_native precompile`` builds ahead of time.

Op modules import neither cutlass nor the kernels: every family's impls reach the compiler through
the family's guarded loader (``python_native_dsls.family``) on their first call. Row views come
from ``python_native_dsls.layout`` (pure metadata checks, shared with the Triton library).
"""

from __future__ import annotations

from types import ModuleType

from python_native_dsls.family import Family, discover, library
from python_native_dsls.spec import OverrideSpec

from ..target import dispatch_key

__all__ = ["SKIPPED", "OverrideSpec", "all_overrides", "families"]

# Families the last ``all_overrides()`` left out, and ops registration left out (unmeasured ones
# without GPU timings: ``dsl_support.register_specs``), with why (the status report shows them).
SKIPPED: dict[str, str] = {}


def _modules() -> list[ModuleType]:
    return discover(__name__, {})


def families() -> list[Family]:
    """Every family of the library, by module name (a module that fails to import is left out here,
    and named in ``SKIPPED`` by ``all_overrides``)."""
    return [m.FAMILY for m in _modules()]


def all_overrides() -> list[OverrideSpec]:
    """Every override installable at the CUDA key (``family.library``: whole families only)."""
    return library(__name__, dispatch_key(), SKIPPED)


def precompile_specializations() -> list[tuple[str, str, object]]:
    """``(op, size class, specialization)`` for every declared specialization of every family."""
    return [entry for module in _modules() for entry in getattr(module, "precompile_specializations", list)()]
