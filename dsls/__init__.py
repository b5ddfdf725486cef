"""DSL backends for python-native: each subpackage wraps one kernel DSL.

Importing a backend never imports its DSL runtime; kernels are loaded on first use. The modules at
this level are shared by every backend: ``family`` (op families as declarations, and the guarded
kernel loader), ``conds`` (the conds generated from them), ``norms`` (the norm families' checks),
``why`` (declines in words), ``spec`` (what an op library registers), ``layout`` (tensors seen
as rows), ``scalars`` (aten's Scalar conversion, and the values the kernels leave to aten) and
``constants`` (aten's defaults, the SM count). ``announce`` is what every backend package does as
its last statement; it imports ``python_native`` only when called, so the backends share it without
importing each other and without importing the control plane before they are complete.
"""

from __future__ import annotations

import sys


def announce(name: str, module_name: str) -> None:
    """Hand the backend ``name`` (the module ``module_name``, fully imported) to the control plane.

    When ``python_native`` is importing the backend from another thread at this very moment, the
    import machinery reports a deadlock here instead; ``python_native`` registers the backend then."""
    try:
        # The package first: while another thread imports it, this waits on its import lock (or, where
        # that thread waits on this module, the import machinery reports the deadlock) before any of its rooms.
        import python_native  # noqa: F401
        from python_native.panel import bootstrap
    except RuntimeError as e:
        if type(e).__name__ != "_DeadlockError":
            raise
    else:
        bootstrap.backend_loaded(name, sys.modules[module_name])
