"""The exception an impl raises to step aside after its cond said yes.

It lives in the core because the routers the core generates catch it (``codegen.UNAVAILABLE_GLOBAL``
names it in every router's namespace), and the backends and the panel raise it.
"""

from __future__ import annotations


class OverrideUnavailable(RuntimeError):
    """Raised by an impl that cannot serve calls after all (its DSL's runtime failed to load, say):
    the router goes on with the next override or aten's kernel, as if the cond had declined.

    Raise it before changing anything the caller can see. ``python_native.panel.dsl_support.runtime_failed``
    builds one after taking the DSL out of routing, so later calls skip it without trying.
    """
