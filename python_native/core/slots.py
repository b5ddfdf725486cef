"""Slots: one ``(namespace, op, dispatch key)`` in the dispatcher, and its registration there.

The first override of a slot captures the kernel the dispatcher had at the key (the *fallback*)
and registers the slot's router function once, through a ``torch.library.Library`` of the
slot's own. Later changes swap the router's ``__code__`` (see ``routers``), never the
registration. Uninstalling destroys that library, so the dispatcher is exactly as it was before
the first override, and every reference the slot held is dropped.
"""

from __future__ import annotations

import builtins
import inspect
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.profiler as _profiler

from python_native.core import extensions
from python_native.foundations import codegen, epilogues, scalars, schema

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

_NUMBER_TYPES = frozenset({bool, int, float, complex})

_ALLOW_OVERRIDE = (
    {"allow_override": True}
    if "allow_override" in inspect.signature(torch.library.Library.impl).parameters
    else {}
)


class Slot:
    """One ``(lib, op, dispatch key)`` in the dispatcher and the overrides routed there."""

    def __init__(self, lib: str, sig: schema.OpSignature, dispatch_key: str, namespace: dict[str, Any]):
        self.lib = lib
        self.sig = sig
        self.dispatch_key = dispatch_key
        self.namespace = namespace  # the routers' globals: the fallback, each override's pieces
        self.overrides: list[OverrideHandle] = []
        self.entry: Any = None  # the function registered with the dispatcher
        self.library: torch.library.Library | None = None  # holds only this slot's registration
        self.shadowed = ""  # the dispatcher's description of the kernel the fallback captured
        self.codes: dict[tuple, tuple[str, Any]] = {}  # compiled router variants, by active set
        self.current_source = ""
        self.active: tuple[OverrideHandle, ...] = ()  # what the router routes to now, in order
        self.traced = False  # whether the router records trace events now
        self.below = False  # whether the router runs the kernel it shadows inside ``below``'s guard

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.lib, self.sig.qualified, self.dispatch_key)

    @property
    def label(self) -> str:
        return f"{self.lib}::{self.sig.qualified} @ {self.dispatch_key}"

    @property
    def file_stem(self) -> str:
        return f"{self.lib}__{self.sig.qualified.replace('.', '_')}__{self.dispatch_key}"

    @property
    def op_name(self) -> str:
        """The dispatcher's name of the op, ``"aten::add.Tensor"``."""
        return f"{self.lib}::{self.sig.qualified}"


_captured: dict[tuple[str, str, str], Any] = {}  # (op, key, the dispatcher's description) -> kernel


def current_kernel(lib: str, sig: schema.OpSignature, key: str, fresh: bool = False) -> Any:
    """The kernel the dispatcher runs now for ``lib::sig`` at ``key`` (what a new slot falls back to).

    Captured once per kernel (its description in the dispatcher's dump names it): each capture
    costs the kernel a token that torch never frees, so a slot installed again and again reuses
    it. ``fresh`` captures anew (after a captured kernel was invalidated).
    """
    name = f"{lib}::{sig.qualified}"
    top = next((line for line in torch._C._dispatch_dump(name).splitlines() if line.startswith(f"{key}:")), "")
    cache_key = (name, key, top)
    kernel = None if fresh or not top else _captured.get(cache_key)
    if kernel is None:
        try:
            kernel = torch.library.get_kernel(name, key)
        except RuntimeError as e:
            raise ValueError(f"{name} has no kernel at {key} to fall back to, so it cannot be overridden there") from e
        if top:
            if len(_captured) >= 1024:
                _captured.clear()
            _captured[cache_key] = kernel
    return kernel


def new_slot(lib: str, sig: schema.OpSignature, key: str, emit: Callable[..., None],
             recapture: Callable[[Slot, RuntimeError], bool]) -> Slot:
    """A slot whose namespace holds the captured fallback and everything a router names."""
    namespace: dict[str, Any] = {
        "__name__": f"python_native.routers.{lib}",
        "__builtins__": builtins,
        "_pn_fallback": current_kernel(lib, sig, key),
        "_pn_profiler": _profiler,
        "_pn_record_function": torch.autograd.profiler.record_function,
        "_pn_trace": emit,
        "_pn_fallback_event": (sig.qualified, key, None, "fallback", None, None),
        "_pn_numbers": _NUMBER_TYPES,
        "_pn_coerce": scalars.coerce,
        codegen.UNAVAILABLE_GLOBAL: codegen.OverrideUnavailable,
        **epilogues.EPILOGUE_GLOBALS,
    }
    slot = Slot(lib, sig, key, namespace)
    namespace["_pn_recapture"] = lambda error: recapture(slot, error)
    return slot


def register_entry(slot: Slot) -> None:
    """Put ``slot.entry`` into the dispatcher through a Library of its own; then tell the slot
    listeners (a compiled front registers above it)."""
    library = torch.library.Library(slot.lib, "IMPL", slot.dispatch_key)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            library.impl(slot.sig.qualified, slot.entry, slot.dispatch_key, with_keyset=True, **_ALLOW_OVERRIDE)
    except BaseException:
        library._destroy()
        raise
    slot.library = library
    slot.shadowed = shadowed_kernel(slot)
    extensions.notify(extensions.SLOT_REGISTERED, slot)


def unregister_entry(slot: Slot) -> None:
    """Take ``slot``'s registration out of the dispatcher (the kernel below serves again); the slot
    listeners hear first, so whatever they registered above it goes before it.

    A call on another thread may have looked our kernel up just before it went (and wait for the
    GIL inside it): the dispatcher's holder of our router is kept alive (``GRAVEYARD``) until no
    thread runs the router and a grace period has passed, so such a call finds it whole.
    """
    if slot.library is None:
        return
    extensions.notify(extensions.SLOT_UNREGISTERING, slot)
    try:
        keepalive = torch.library.get_kernel(slot.op_name, slot.dispatch_key)  # our router's holder
    except RuntimeError:  # the op's schema is gone (its library destroyed): no call can reach it now
        keepalive = None
    library, slot.library = slot.library, None
    library._destroy()
    GRAVEYARD.bury(keepalive, slot)


class Graveyard:
    """Kernels taken out of the dispatcher, kept until no call can be inside them."""

    GRACE_SECONDS = 1.0

    def __init__(self) -> None:
        self._kept: list[tuple[float, Any, frozenset]] = []
        self._lock = threading.Lock()

    def bury(self, kernel: Any, slot: Slot) -> None:
        codes = frozenset(code for _, code in slot.codes.values()) | {slot.entry.__code__}
        with self._lock:
            self._kept.append((time.monotonic(), kernel, codes))
        self.sweep()

    def sweep(self) -> None:
        """Let go of kernels buried longer than the grace period whose router no thread runs now."""
        now = time.monotonic()
        with self._lock:
            due = [entry for entry in self._kept if now - entry[0] >= self.GRACE_SECONDS]
            if not due:
                return
            running = running_codes()
            self._kept = [entry for entry in self._kept if entry not in due or entry[2] & running]

    def __len__(self) -> int:
        return len(self._kept)

    def renew_lock(self) -> None:
        """In a forked child: a lock another thread held at the fork stays held forever."""
        self._lock = threading.Lock()


def running_codes() -> set:
    """The code objects on every thread's stack now."""
    found = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            found.add(frame.f_code)
            frame = frame.f_back
    return found


GRAVEYARD = Graveyard()


def recapture(slot: Slot, error: RuntimeError) -> bool:
    """After the captured kernel raised: capture the dispatcher's kernel again if it changed.

    The kernel under ours changes when a ``torch.library.Library`` that provided it is destroyed;
    the captured one then refuses every call. Our registration is taken out to read the kernel now
    at the key, then put back. True when the caller should retry. The caller holds the lock.
    """
    if slot.library is None:
        return False
    stale = "invalidated" in str(error) or shadowed_kernel(slot) != slot.shadowed
    if not stale:
        return False
    unregister_entry(slot)
    try:
        fallback = current_kernel(slot.lib, slot.sig, slot.dispatch_key, fresh=True)
    except ValueError:
        fallback = None
    if fallback is not None:
        slot.namespace["_pn_fallback"] = fallback
    register_entry(slot)
    return fallback is not None


# How the dispatcher names our own registrations ("registered at <where>"): the routers' (this
# file), and whatever a listener registers above them (``extensions.OWN_REGISTRATIONS``).
_OWN_REGISTRATION = f"registered at {__file__}:"


def shadowed_kernel(slot: Slot) -> str:
    """How the dispatcher describes the kernel right under ours at the slot's key."""
    prefixes = (f"{slot.dispatch_key}:", f"{slot.dispatch_key} (inactive):")
    own = (_OWN_REGISTRATION, *extensions.OWN_REGISTRATIONS)
    for line in torch._C._dispatch_dump(slot.op_name).splitlines():
        if line.startswith(prefixes) and not any(marker in line for marker in own):
            return line
    return ""
