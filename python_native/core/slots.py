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
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.profiler as _profiler

from python_native import codegen, epilogues, scalars, schema

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

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.lib, self.sig.qualified, self.dispatch_key)

    @property
    def label(self) -> str:
        return f"{self.lib}::{self.sig.qualified} @ {self.dispatch_key}"

    @property
    def file_stem(self) -> str:
        return f"{self.lib}__{self.sig.qualified.replace('.', '_')}__{self.dispatch_key}"


def current_kernel(lib: str, sig: schema.OpSignature, key: str) -> Any:
    """The kernel the dispatcher runs now for ``lib::sig`` at ``key`` (what a new slot falls back to)."""
    try:
        return torch.library.get_kernel(f"{lib}::{sig.qualified}", key)
    except RuntimeError as e:
        raise ValueError(
            f"{lib}::{sig.qualified} has no kernel at {key} to fall back to, so it cannot be overridden there"
        ) from e


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
        "_pn_fallback_event": (sig.qualified, key, None, "fallback", None),
        "_pn_numbers": _NUMBER_TYPES,
        "_pn_coerce": scalars.coerce,
        codegen.UNAVAILABLE_GLOBAL: codegen.OverrideUnavailable,
        **epilogues.EPILOGUE_GLOBALS,
    }
    slot = Slot(lib, sig, key, namespace)
    namespace["_pn_recapture"] = lambda error: recapture(slot, error)
    return slot


def register_entry(slot: Slot) -> None:
    """Put ``slot.entry`` into the dispatcher through a Library of its own."""
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


def unregister_entry(slot: Slot) -> None:
    """Take ``slot``'s registration out of the dispatcher (the kernel below serves again)."""
    library, slot.library = slot.library, None
    if library is not None:
        library._destroy()


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
        fallback = current_kernel(slot.lib, slot.sig, slot.dispatch_key)
    except ValueError:
        fallback = None
    finally:
        register_entry(slot)
    if fallback is None:
        return False
    slot.namespace["_pn_fallback"] = fallback
    return True


def shadowed_kernel(slot: Slot) -> str:
    """How the dispatcher describes the kernel right under ours at the slot's key."""
    prefix = f"{slot.dispatch_key} (inactive):"
    for line in torch._C._dispatch_dump(f"{slot.lib}::{slot.sig.qualified}").splitlines():
        if line.startswith(prefix):
            return line
    return ""
