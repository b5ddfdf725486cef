"""Slots: one definition of ``(namespace, op)`` at one dispatch key, and its registration there.

The first override of a slot captures the kernel the dispatcher had at the key (the *fallback*)
and registers the slot's router function once, through a ``torch.library.Library`` of the
slot's own. Later changes swap the router's ``__code__`` (see ``routers``), never the
registration. Uninstalling destroys that library, so the dispatcher is exactly as it was before
the first override; what a call on its way in may still need is retired (``reclaim``).

A slot belongs to one *definition* of its op: the ``OpOverload`` torch had for it when the slot was
made. Destroying the ``torch.library.Library`` that defined an op drops torch's object, so an op
defined again under the same name (with its schema or another) has a new one, and gets a new slot
(``Registry``): nothing built for the old definition (router, captured kernel) serves the new one.
"""

from __future__ import annotations

import builtins
import inspect
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.profiler as _profiler

from python_native.core import errors, extensions, reclaim
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

    def __init__(self, lib: str, sig: schema.OpSignature, dispatch_key: str, namespace: dict[str, Any],
                 definition: torch._ops.OpOverload):
        self.lib = lib
        self.sig = sig
        self.dispatch_key = dispatch_key
        self.namespace = namespace  # the routers' globals: the fallback, each override's pieces
        self.definition = definition  # torch's object for the op when the slot was made (see the module doc)
        self.schema_text = str(definition._schema)
        self.overrides: list[OverrideHandle] = []
        self.entry: Any = None  # the function registered with the dispatcher
        self.library: torch.library.Library | None = None  # holds only this slot's registration
        self.holder: Any = None  # the dispatcher's holder of ``entry`` while registered (a SafeKernelFunction)
        self.shadowed = ""  # the dispatcher's description of the kernel the fallback captured
        self.codes: dict[tuple, tuple[str, Any]] = {}  # compiled routers, by active set (and traced, guarded)
        self.current_source = ""
        self.active: tuple[OverrideHandle, ...] = ()  # what the router routes to now, in order
        self.traced = False  # whether the router records trace events now
        self.guarded = False  # whether the router runs the kernel it shadows inside ``nested_aten``'s guard

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


# (op, key, the dispatcher's description, the op's definition) -> kernel
_captured: dict[tuple[str, str, str, Any], Any] = {}


def current_kernel(lib: str, sig: schema.OpSignature, key: str, definition: Any, uncached: bool = False) -> Any:
    """The kernel the dispatcher runs now for ``lib::sig`` at ``key`` (what a new slot falls back to).

    Captured once per kernel of a definition (its description in the dispatcher's dump names it,
    but an op defined again registers its kernel under the same description): each capture costs
    the kernel a token that torch never frees, so a slot installed again and again reuses it.
    ``uncached`` captures anew (after a captured kernel was invalidated).
    """
    name = f"{lib}::{sig.qualified}"
    top = next((line for line in torch._C._dispatch_dump(name).splitlines() if line.startswith(f"{key}:")), "")
    cache_key = (name, key, top, definition)
    kernel = None if uncached or not top else _captured.get(cache_key)
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


def definition_of(lib: str, sig: schema.OpSignature) -> torch._ops.OpOverload | None:
    """Torch's object for ``lib::sig`` now (None while the op is not defined)."""
    return schema.find_overload(lib, sig.qualified)


def redefined(slot: Slot) -> bool:
    """Whether ``slot``'s op was destroyed (and maybe defined again) since the slot was made."""
    return definition_of(slot.lib, slot.sig) is not slot.definition


def schema_kept(slot: Slot) -> bool:
    """Whether ``slot``'s op is defined now with the schema the slot was built for."""
    now = definition_of(slot.lib, slot.sig)
    return now is not None and str(now._schema) == slot.schema_text


def new_slot(lib: str, sig: schema.OpSignature, key: str, emit: Callable[..., None],
             recapture: Callable[[Slot, RuntimeError], bool]) -> Slot:
    """A slot of the op's current definition; its namespace holds the captured fallback and everything a router names."""
    definition = definition_of(lib, sig)
    if definition is None:
        raise ValueError(f"{lib}::{sig.qualified} does not exist")
    namespace: dict[str, Any] = {
        "__name__": f"python_native.routers.{lib}",
        "__builtins__": builtins,
        "_pn_fallback": current_kernel(lib, sig, key, definition),
        "_pn_profiler": _profiler,
        "_pn_record_function": torch.autograd.profiler.record_function,
        "_pn_trace": emit,
        "_pn_fallback_event": (sig.qualified, key, None, "fallback", None, None),
        "_pn_numbers": _NUMBER_TYPES,
        "_pn_coerce": scalars.coerce,
        codegen.UNAVAILABLE_GLOBAL: errors.OverrideUnavailable,
        **epilogues.EPILOGUE_GLOBALS,
    }
    slot = Slot(lib, sig, key, namespace, definition)
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
        holder = torch.library.get_kernel(slot.op_name, slot.dispatch_key)  # ours: the latest at the key
    except BaseException:
        library._destroy()
        raise
    slot.library, slot.holder = library, holder
    slot.shadowed = shadowed_kernel(slot)
    extensions.notify(extensions.POINTS.slot_registered, slot)


def unregister_entry(slot: Slot) -> None:
    """Take ``slot``'s registration out of the dispatcher (the kernel below serves again); the slot
    listeners hear first, so whatever they registered above it goes before it.

    A call on another thread may have looked our kernel up just before it went (and wait for the
    GIL inside it): the dispatcher's holder of our router and the slot's namespace are retired
    (``reclaim``), so such a call finds them whole.
    """
    if slot.library is None:
        return
    extensions.notify(extensions.POINTS.slot_unregistering, slot)
    library, holder = slot.library, slot.holder
    slot.library = slot.holder = None
    library._destroy()
    reclaim.retire(f"router of {slot.label}", holder, namespaces=(slot.namespace,))


def recapture(slot: Slot, error: RuntimeError) -> bool:
    """After the captured kernel raised: capture the dispatcher's kernel again if it changed.

    The kernel under ours changes when a ``torch.library.Library`` that provided it is destroyed;
    the captured one then refuses every call. Our registration is taken out to read the kernel now
    at the key, then put back. True when the caller should retry. The caller holds the lock.

    The kernel also goes when the op itself was destroyed and defined again: with the schema the
    router was built for, the slot then serves the new definition (as a registration would make
    it do); with another one, nothing is retried (a registration replaces the slot).
    """
    if slot.library is None or not schema_kept(slot):
        return False
    stale = "invalidated" in str(error) or shadowed_kernel(slot) != slot.shadowed
    if not stale:
        return False
    slot.definition = definition_of(slot.lib, slot.sig)
    unregister_entry(slot)
    try:
        fallback = current_kernel(slot.lib, slot.sig, slot.dispatch_key, slot.definition, uncached=True)
    except ValueError:
        fallback = None
    if fallback is not None:
        slot.namespace["_pn_fallback"] = fallback
    register_entry(slot)
    return fallback is not None


# How the dispatcher names our own registrations ("registered at <where>"): the routers' (this
# file), and whatever a feature registers above them (``extensions.own_registrations``).
_OWN_REGISTRATION = f"registered at {__file__}:"


def shadowed_kernel(slot: Slot) -> str:
    """How the dispatcher describes the kernel right under ours at the slot's key."""
    prefixes = (f"{slot.dispatch_key}:", f"{slot.dispatch_key} (inactive):")
    own = (_OWN_REGISTRATION, *extensions.own_registrations())
    for line in torch._C._dispatch_dump(slot.op_name).splitlines():
        if line.startswith(prefixes) and not any(marker in line for marker in own):
            return line
    return ""
