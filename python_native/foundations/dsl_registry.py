"""The DSLs python-native knows: built-in backends, ``register_dsl`` calls, and entry points.

A DSL is a module (or any object) with ``runtime_available() -> bool`` and
``runtime_version() -> Version | None``; ``unavailable_reason() -> str | None`` is optional and
feeds the status report. Third-party packages announce theirs in the ``python_native.dsls``
entry-point group (value: a module, or a callable returning one); that group is read the first
time the DSL list is asked for, never during ``import torch``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from packaging.version import Version

log = logging.getLogger("python_native")
_T = TypeVar("_T")

ENTRY_POINT_GROUP = "python_native.dsls"


_dsls: dict[str, Any] = {}
_runtime_failures: dict[str, str] = {}  # DSL name -> why its runtime failed when first used
_reserved: set[str] = set()  # names the panel uses itself (``pn.status``...): never a DSL's
_lock = threading.RLock()
_entry_points_loaded = False


def reserve_names(names: set[str] | frozenset[str]) -> None:
    """Refuse these names to DSLs: they are attributes of the panel (``pn.<name>``)."""
    _reserved.update(names)


def _check_module(name: str, module: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"DSL name must be a str, got {type(name).__name__}: {name!r}")
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"DSL name {name!r} must be a public Python identifier (it becomes pn.{name})")
    missing = [attr for attr in ("runtime_available", "runtime_version") if not callable(getattr(module, attr, None))]
    if missing:
        raise TypeError(f"DSL {name!r}: module {module!r} lacks callable {', '.join(missing)}")


def register_dsl(name: str, module: Any) -> None:
    """Make ``name`` a DSL (``pn.<name>``); registering the same module again is a no-op."""
    _check_module(name, module)
    if name in _reserved:
        raise ValueError(f"DSL name {name!r} clashes with python_native's own attribute pn.{name}")
    with _lock:
        current = _dsls.get(name)
        if current is not None and current is not module:
            raise ValueError(f"DSL {name!r} is already registered by {current!r}")
        _dsls[name] = module


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    with _lock:
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                module = obj() if callable(obj) and not hasattr(obj, "runtime_available") else obj
                register_dsl(ep.name, module)
            except Exception:
                log.exception("python_native: could not load DSL entry point %r (%s)", ep.name, ep.value)


def names() -> list[str]:
    """Every DSL name, built-in first, in registration order."""
    _load_entry_points()
    return list(_dsls)


def get(name: str) -> Any | None:
    if name not in _dsls:
        _load_entry_points()
    return _dsls.get(name)


def is_known(name: str) -> bool:
    return get(name) is not None


def is_registered(name: str) -> bool:
    """Whether ``name`` is registered already, entry points left unread (``import torch`` reads none)."""
    return name in _dsls


def record_runtime_failure(name: str, reason: str) -> bool:
    """``name``'s runtime failed when first used (an import that raised): from now on the DSL is
    unavailable, with ``reason`` as why. True the first time."""
    with _lock:
        first = name not in _runtime_failures
        _runtime_failures.setdefault(name, reason)
        return first


def runtime_failure(name: str) -> str | None:
    return _runtime_failures.get(name)


def _asked(name: str, check: str, call: Callable[[], _T], otherwise: _T) -> _T:
    """``call()``, a question put to DSL ``name``'s module; ``otherwise`` where it raises (logged):
    a broken DSL module must not break whoever asked."""
    try:
        return call()
    except Exception:
        log.exception("python_native: %s of DSL %r raised", check, name)
        return otherwise


def available(name: str) -> bool:
    module = get(name)
    if module is None or name in _runtime_failures:
        return False
    return _asked(name, "runtime_available()", lambda: bool(module.runtime_available()), False)


def routable(name: str) -> bool:
    """Whether overrides of ``name`` may be routed to: its ``can_register()`` where it has one
    (cheaper, no device probe), else its availability; a check that raises counts as no."""
    module = get(name)
    check = getattr(module, "can_register", None)
    if not callable(check):
        return available(name)
    return _asked(name, "can_register()", lambda: bool(check()), False)


def version(name: str) -> Version | None:
    module = get(name)
    if module is None:
        return None
    return _asked(name, "runtime_version()", module.runtime_version, None)


def unavailable_reason(name: str) -> str | None:
    """Why ``name`` cannot run here (None when it can)."""
    module = get(name)
    if module is None:
        return "not registered"
    if name in _runtime_failures:
        return _runtime_failures[name]
    reason_fn = getattr(module, "unavailable_reason", None)
    if callable(reason_fn):
        try:
            return reason_fn()
        except Exception as e:  # a broken DSL module must not break the report
            return f"availability check failed: {e!r}"
    return None if available(name) else "runtime not available"


def _renew_lock_in_child() -> None:
    """A forked child must not inherit the lock another thread held at the fork."""
    global _lock
    if not _lock._is_owned():
        _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)
