"""Every op of every built-in backend's families, in one list: what the tools iterate (verify's
drivers, bench's rows) instead of tables of their own. Importing it imports the backends' op
modules (light: no DSL runtime), found by listing their ``ops`` packages."""

from __future__ import annotations

from python_native_dsls.family import Built

__all__ = ["built_ops"]


def built_ops() -> list[Built]:
    """Each declared op as its family built it: the Triton library's families first, then the CuTe
    DSL's, each in module-name order (an op both declare appears once per backend)."""
    from python_native_dsls.cutedsl.ops import families as cutedsl_families
    from python_native_dsls.triton.ops import families as triton_families

    return [built for family in [*triton_families(), *cutedsl_families()] for built in family]
