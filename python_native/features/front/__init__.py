"""The compiled dispatch front: calls the package does not speed up cost what aten costs.

Every slot's Python router is registered in the dispatcher (``core.slots``). Where the front is
built, a small C++ kernel (``front.cpp``) is registered above each router. It holds the kernel the
slot shadows, the router (as a kernel to call boxed) and a state this module keeps in step with the
slot, atomically:

- *fallback*: nothing in the slot can fire (no active override, its DSL or op switched off): every
  call goes to the shadowed kernel without entering Python;
- *gated*: every active override carries a calibration gate that surely declines some calls (by
  dtype, row width class and size bucket of the first tensor argument): those go to the shadowed
  kernel, the rest enter the router;
- *python*: every call enters the router, as without the front. Traced slots, checked mode, and
  overrides whose decisions cannot be known ahead stay here.

Which front serves is decided at import: ``PYTHON_NATIVE_FRONT=python`` forces the Python routers;
``compiled`` builds the front if needed (a failed build is an error, with the compiler's output);
unset, a cached build that passes the trust checks is loaded (a few milliseconds) and nothing is
ever compiled during ``import torch``: without one the routers serve alone, a build starts in the
background for the processes that follow (``background``), and ``pn.status()`` says which.
``PYTHON_NATIVE_DISABLE=1`` loads nothing.

A removed front is retired to the core's reclaim queue (``core.reclaim``): it keeps its kernel
alive until no call is inside it (its in-flight count) and the grace period has passed, so a call
that looked it up just before it went never finds it freed.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from python_native.core import extensions, reclaim
from python_native.core.registry import REGISTRY
from python_native.features.front import background, build, replay
from python_native.foundations import env

log = logging.getLogger("python_native")

ENV = "PYTHON_NATIVE_FRONT"
CHOICES = ("python", "compiled")
# What gates call dtypes (``"float32"``) against the C++ scalar type names.
_DTYPE_NAMES = {
    "float32": "Float", "float16": "Half", "bfloat16": "BFloat16", "float64": "Double", "int64": "Long",
    "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}


class _Front:
    """The process's front: which one serves, and the C++ front of every slot while compiled."""

    def __init__(self) -> None:
        self.module: ModuleType | None = None
        self.path: Path | None = None
        self.active = False
        self.requested: str | None = None
        self.reason = ""
        self.error: str | None = None
        self.fronts: dict[Any, Any] = {}  # slot -> its C++ front
        self.applied: dict[Any, tuple] = {}  # slot -> the masks last set (gated mode)
        self.mode_cells: dict[Any, memoryview] = {}  # slot -> its front's mode, as one writable uint32
        self.scalar_types: dict[str, int] = {}
        self.wide_row = 0  # the gates' wide-row rule the fronts were made with (0: no gates declared)


_state = _Front()


def requested() -> str | None:
    """``PYTHON_NATIVE_FRONT``, checked: None when unset (a malformed value warns once, then counts as unset)."""
    value = env.front_setting()
    if value is None:
        return None
    if value not in CHOICES:
        warnings.warn(f"python_native: {ENV}={value!r} is not one of {list(CHOICES)}; ignored", UserWarning, stacklevel=2)
        return None
    return value


def start() -> None:
    """Pick the front at import (see the module docstring); never compiles unless asked to."""
    choice = _state.requested = requested()
    if env.overrides_disabled():
        _state.reason = f"{env.DISABLE_ALL[0]} is set: nothing of python-native's is loaded"
        return
    if choice == "python":
        _state.reason = f"{ENV}=python"
        return
    if choice == "compiled":
        module, path, cached, seconds = build.build()  # a failed build raises, with the compiler's output
        _state.reason = f"{ENV}=compiled ({'cached build' if cached else f'built in {seconds:.0f} s'})"
        _use(module, path)
        return
    try:
        module, path, _state.reason = background.find_or_start()
    except Exception as e:  # a library that fails to load must not cost the Python routers
        _state.error = f"loading the cached build failed: {type(e).__name__}: {e}"
        _state.reason = "the cached build could not be loaded; the Python routers serve"
        log.warning("python_native: %s", _state.error)
        return
    if module is not None:
        _use(module, path)


def _use(module: ModuleType, path: Path) -> None:
    _attach(module, path)
    enable()


def _attach(module: ModuleType, path: Path) -> None:
    if _state.module is not None:
        return
    global _PYTHON, _FALLBACK
    _state.module, _state.path = module, path
    _PYTHON, _FALLBACK = (module.MODE_PYTHON, ()), (module.MODE_FALLBACK, ())
    _state.scalar_types = dict(module.scalar_types())


def ensure_built() -> dict[str, Any]:
    """Build the compiled front if this torch and compiler have none yet (``precompile`` calls
    this), and make it available to ``enable``; returns where it is and whether it was cached.
    Refused while ``PYTHON_NATIVE_DISABLE`` is set: then nothing of ours is loaded."""
    if env.overrides_disabled():
        raise RuntimeError(f"{env.DISABLE_ALL[0]} is set: python-native loads nothing in this process; unset it to build")
    module, path, cached, seconds = build.build()
    _attach(module, path)
    return {"library": str(path), "cached": cached, "seconds": round(seconds, 1)}


# ----- switching the compiled front on and off (at import, and for side-by-side measurements) -----


def enable() -> None:
    """Serve through the compiled front from now on (it must be built: see ``build.build``)."""
    if _state.module is None:
        raise RuntimeError(f"the compiled front is not built here: {_state.reason}")
    with REGISTRY.lock:
        if _state.active:
            return
        _state.active = True
        for slot in list(REGISTRY.slots.values()):
            if slot.library is not None:
                _registered(slot)
        replay.decide()


def disable() -> None:
    """Serve through the Python routers alone from now on (fronts are taken out of every slot)."""
    with REGISTRY.lock:
        if not _state.active:
            return
        _state.active = False
        for slot in list(_state.fronts):
            _unregistering(slot)


@contextmanager
def serving(name: str) -> Iterator[None]:
    """Inside the block, ``name`` ("python" or "compiled") serves; the previous front after it."""
    if name not in CHOICES:
        raise ValueError(f"front must be one of {list(CHOICES)}, got {name!r}")
    was = _state.active
    enable() if name == "compiled" else disable()
    try:
        yield
    finally:
        enable() if was else disable()


def current() -> str:
    """The front serving now: ``"compiled"`` or ``"python"``."""
    return "compiled" if _state.active else "python"


# ----- following the slots -----


def _registered(slot: Any) -> None:
    if not _state.active:  # the Python routers serve alone
        return
    # The width class is the gates' own rule: their wide-row length goes into every front made.
    _state.wide_row = extensions.wide_row()
    front = _state.module.Front(
        f"{slot.lib}::{slot.sig.packet}", "" if slot.sig.overload == "default" else slot.sig.overload,
        slot.dispatch_key, slot.namespace["_pn_fallback"], slot.holder, _state.wide_row or 1 << 62,
    )
    front.install()
    _state.fronts[slot] = front
    _state.mode_cells[slot] = front.mode_view().cast("I")
    replay.track(slot, front)
    _state.applied.pop(slot, None)
    _refreshed(slot)


def _unregistering(slot: Any) -> None:  # with no front in ``slot``, nothing to take out
    replay.untrack(slot)
    cell = _state.mode_cells.pop(slot, None)
    if cell is not None:
        cell.release()  # no write can reach the front once it is let go
    front = _state.fronts.pop(slot, None)
    _state.applied.pop(slot, None)
    if front is None:
        return
    front.uninstall()
    reclaim.retire(f"compiled front of {slot.label}", front, inflight=lambda: front.inflight)


def _refreshed(slot: Any) -> None:
    # Runs twice per toggle of the slot's switches: the common modes cost a dict read, the decision
    # and a store into the mode's bytes.
    cell = _state.mode_cells.get(slot)
    if cell is None:
        return
    mode, masks = _FALLBACK if not slot.active and not slot.traced and not slot.guarded else _decide(slot)
    if masks:
        if cell[0] != mode or _state.applied.get(slot) != masks:
            front = _state.fronts[slot]
            front.set_masks(list(masks))
            front.set_mode(mode)  # its release store publishes the masks with the mode
            _state.applied[slot] = masks
    elif cell[0] != mode:
        cell[0] = mode
    if _REPLAY.on:
        replay.follow(slot)


_REPLAY = replay.STATE
_PYTHON: tuple[int, tuple] = (-1, ())  # the two decisions without masks, set when a build is attached
_FALLBACK: tuple[int, tuple] = (-1, ())


def _decide(slot: Any) -> tuple[int, tuple]:
    """The front's mode for ``slot`` now, and the masks of calls every active override declines."""
    m = _state.module
    if slot.traced or slot.guarded:  # the router records, or runs its kernel inside the nested-aten guard
        return _PYTHON
    if not slot.active:
        return _FALLBACK
    combined: dict[str, list[int]] | None = None
    for o in slot.active:
        if o.unconditional or extensions.sees_every_call(o.routed_impl):
            return _PYTHON
        found = extensions.masks_of(o.routed_cond)
        if found is None or found[0] != _state.wide_row:  # no gate, or one that classifies calls otherwise
            return _PYTHON
        masks = found[1](slot.dispatch_key)
        if not masks:
            return _PYTHON
        if combined is None:
            combined = {dtype: [narrow, wide] for dtype, (narrow, wide) in masks.items()}
        else:  # a call is surely declined only where every active override declines it
            combined = {dtype: [pair[0] & masks[dtype][0], pair[1] & masks[dtype][1]]
                        for dtype, pair in combined.items() if dtype in masks}
    entries = tuple(
        (_state.scalar_types[_DTYPE_NAMES[dtype]], narrow, wide)
        for dtype, (narrow, wide) in sorted(combined.items())
        if (narrow or wide) and _DTYPE_NAMES.get(dtype) in _state.scalar_types
    )
    return (m.MODE_GATED, entries) if entries else _PYTHON


def describe() -> dict[str, Any]:
    """Which front serves and why, for the status report."""
    modes = {}
    if _state.active:
        names = {_state.module.MODE_PYTHON: "python", _state.module.MODE_FALLBACK: "fallback",
                 _state.module.MODE_GATED: "gated"}
        modes = {slot.label: names.get(front.mode, "?") for slot, front in _state.fronts.items()}
    return {
        "front": current(),
        "requested": _state.requested,
        "why": background.progress() or _state.reason,
        "error": _state.error,
        "background_build": background.describe(),
        "library": str(_state.path) if _state.path else None,
        "slots": modes,
        "replay": replay.describe() if _state.active else {"on": False, "why": "the compiled front is not serving"},
    }


def _own_registration() -> str | None:
    """How the dispatcher's dump names a front's registration (None: no front is built)."""
    return f"registered at {_state.module.MARKER}:" if _state.module is not None else None


# Order 10: replay's recorder sits outside every other impl wrapper (it records what they launch).
extensions.register(extensions.Hooks(
    "compiled front", order=10, wrap_impl=replay.recording, unwrap=replay.unwrap, slot_registered=_registered,
    slot_unregistering=_unregistering, slot_refreshed=_refreshed, own_registration=_own_registration,
    status=describe, status_key="front"))
start()

__all__ = ["CHOICES", "ENV", "build", "current", "replay", "describe", "disable", "enable", "ensure_built", "requested", "serving",
           "start"]
