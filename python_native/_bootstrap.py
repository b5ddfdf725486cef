"""Register the built-in DSL backends and install their op libraries where they can run.

A backend module announces itself with ``backend_loaded`` as its last statement, so it is
registered whichever is imported first: ``python_native`` (which imports the backends) or the
backend (which imports ``python_native`` for its helpers, while it is itself half-initialised).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from types import ModuleType

from python_native import dsl_registry, env

log = logging.getLogger("python_native")

BUILTIN_DSLS = {"triton": "python_native_dsls.triton", "cutedsl": "python_native_dsls.cutedsl"}

_loaded: set[str] = set()
_lock = threading.Lock()


def load_builtin_dsls() -> None:
    """Import each built-in backend (never its runtime); each registers itself when complete.

    Torch's in-tree overrides (``torch._native``) are taken out of the dispatcher first and
    adopted into this registry last (see ``native_bridge``). A backend that fails is logged and
    skipped: it must never break ``import torch``.
    """
    from python_native import _source_tree, native_bridge

    _source_tree.alias_backends_folder()
    _guarded("detach torch._native's routers", native_bridge.detach)
    for name, module_name in BUILTIN_DSLS.items():
        _load_backend(name, module_name)
    _guarded("adopt torch._native's overrides", native_bridge.adopt_all)


def _load_backend(name: str, module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except RuntimeError as e:
        if type(e).__name__ != "_DeadlockError":
            log.exception("python_native: could not load the %s backend", name)
        # Otherwise another thread is importing the backend; it registers itself when complete.
        return
    except Exception:
        log.exception("python_native: could not load the %s backend", name)
        return
    # A backend imports python_native only in its last statement, so what we get here has all
    # its definitions; announcing it again is a no-op, and covers a backend whose own
    # announcement met this import in another thread.
    backend_loaded(name, module)


def _guarded(what: str, fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("python_native: could not %s", what)


def backend_loaded(name: str, module: ModuleType) -> None:
    """Register a fully imported backend and, where it can run, install its overrides (once)."""
    with _lock:
        if name in _loaded:
            return
        _loaded.add(name)
    try:
        dsl_registry.register_dsl(name, module)
    except Exception:
        log.exception("python_native: could not register the %s backend", name)
        return
    if env.overrides_disabled():
        return
    try:
        can_register = getattr(module, "can_register", module.runtime_available)
        if can_register():
            module.register_overrides()
    except Exception:
        log.exception("python_native: could not register the %s overrides", name)


def _renew_lock_in_child() -> None:
    """A forked child must not inherit the lock another thread held at the fork."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)
