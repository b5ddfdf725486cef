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
import warnings
from types import ModuleType

from python_native.core.registry import REGISTRY
from python_native.foundations import dsl_registry, env

log = logging.getLogger("python_native")

BUILTIN_DSLS = {"triton": "python_native_dsls.triton", "cutedsl": "python_native_dsls.cutedsl"}

_loaded: set[str] = set()
_installed: set[str] = set()  # backends whose overrides were installed (register_overrides ran)
_lock = threading.Lock()
_env_lock = threading.RLock()
_env_applied: tuple[str | None, ...] | None = None  # env.import_time_values() when last applied
_disabled_at_import = False
_warned: set[str] = set()


def load_builtin_dsls() -> None:
    """Import each built-in backend (never its runtime); each registers itself when complete.

    Torch's in-tree overrides (``torch._native``) are taken out of the dispatcher first and
    adopted into this registry last (see ``native_bridge``). A backend that fails is logged and
    skipped: it must never break ``import torch``.
    """
    from python_native.foundations import source_tree as _source_tree
    from python_native.panel import native_bridge

    global _env_applied, _disabled_at_import
    _env_applied = env.import_time_values()
    _disabled_at_import = env.overrides_disabled()
    _source_tree.alias_backends_folder()
    _log_switches()
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
        log.info("python_native: %s installs no overrides: %s is set", name, env.DISABLE_ALL[0])
        return
    _install(name, module)


def _install(name: str, module: ModuleType) -> bool:
    """Install ``module``'s overrides where it can run now (once); whether they were installed."""
    try:
        can_register = getattr(module, "can_register", module.runtime_available)
        if not can_register():
            if log.isEnabledFor(logging.INFO):
                log.info("python_native: %s overrides not installed: %s", name,
                         dsl_registry.unavailable_reason(name) or "its runtime cannot run here")
            return False
        with _lock:
            if name in _installed:
                return False
            _installed.add(name)
        handles = module.register_overrides()
    except Exception:
        log.exception("python_native: could not register the %s overrides", name)
        return False
    if log.isEnabledFor(logging.INFO):
        _log_installed(name, module, handles or [])
    return True


def apply_env_changes() -> None:
    """Honour, or refuse loudly, the switches read at import that changed since (the panel calls this).

    A built-in backend that could not install at import and can now (``PYTHON_NATIVE_TRITON_INTERPRET=1``
    set after ``import torch`` on a machine without a GPU) installs its overrides now. A change that
    cannot take effect (installed overrides cannot move to another dispatch key; the process-wide
    off switch is read once) warns once, naming the variable and what to do. Cheap when nothing
    changed: a few environment reads.
    """
    global _env_applied
    values = env.import_time_values()
    if values == _env_applied or _env_applied is None:
        return
    with _env_lock:
        if values == _env_applied:
            return
        _env_applied = values
        if env.overrides_disabled() != _disabled_at_import:
            variable = env.DISABLE_ALL[0]
            _warn_once(
                f"python_native: {variable} was {'set' if env.overrides_disabled() else 'unset'} after torch "
                f"imported python_native; it is read once, at import, so this process is unchanged. Set it "
                f"before `import torch` (or switch overrides with pn.<dsl>.disable() / pn.operations_disabled())"
            )
        for name in sorted(_loaded):
            module = dsl_registry.get(name)
            if module is None:
                continue
            if name not in _installed and not _disabled_at_import and _install(name, module):
                log.info("python_native: %s overrides installed now: a switch changed after import", name)
            changed = getattr(module, "settings_changed", None)
            problem = changed() if callable(changed) else None
            if problem:
                _warn_once(f"python_native: {problem}")


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=4)


def installed(name: str) -> bool:
    """Whether the built-in backend ``name`` has installed its overrides in this process."""
    return name in _installed


def _log_installed(name: str, module: ModuleType, handles: list) -> None:
    """What a backend installed: how many overrides where, families left out, whether switched off."""
    keys = sorted({h.dispatch_key for h in handles})
    log.info("python_native: %s installed %d overrides at %s", name, len(handles), ", ".join(keys) or "no key")
    skipped = getattr(module, "skipped_overrides", None)
    for family, why in (skipped() if callable(skipped) else {}).items():
        log.info("python_native: %s left out %s: %s", name, family, why)
    if handles and REGISTRY.is_off("dsl", name):
        log.info("python_native: %s overrides installed switched off (pn.%s.enable() routes to them)", name, name)


def _log_switches() -> None:
    """The environment switches set for this process, each with what it does."""
    if not log.isEnabledFor(logging.INFO):
        return
    for switch in env.current():
        if switch["value"] is not None:
            log.info("python_native: %s=%s in force: %s", switch["set_by"], switch["value"], switch["meaning"])


def _renew_lock_in_child() -> None:
    """A forked child must not inherit the lock another thread held at the fork."""
    global _lock, _env_lock
    _lock = threading.Lock()
    _env_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)
