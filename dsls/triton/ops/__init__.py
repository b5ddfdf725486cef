"""The Triton op library: one module per op family, each declaring its ``FAMILY``.

Every family is a ``python_native_dsls.family.Family``: its conds, explanations, plan caches and
guarded kernel loader are built from its declaration, none written here or in the op modules.
A module of this package that declares a ``FAMILY`` is a family of the library by being here
(``family.discover``); modules named ``_*`` and those without one (``why``) are helpers.
"""

from __future__ import annotations

from python_native_dsls.family import Family, discover, library
from python_native_dsls.spec import OverrideSpec

from ..target import dispatch_key

__all__ = ["SKIPPED", "OverrideSpec", "all_overrides", "families"]


# Families the last ``all_overrides()`` left out (broken modules among them), and ops registration left
# out (unmeasured ones at a GPU key: ``dsl_support.register_specs``), with why (the status report shows them).
SKIPPED: dict[str, str] = {}


def families() -> list[Family]:
    """Every family of the library, by module name (op modules are light: no triton import); a module
    that fails to import is left out here, and named in ``SKIPPED`` by ``all_overrides``."""
    return [m.FAMILY for m in discover(__name__, {})]


def all_overrides() -> list[OverrideSpec]:
    """Every override of the library installable at this backend's key (``family.library``)."""
    from ..plans import layout

    layout.backend_device.cache_clear()
    return library(__name__, dispatch_key(), SKIPPED)
