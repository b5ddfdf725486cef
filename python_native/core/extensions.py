"""Where features plug into the dispatch core, which never names them.

Extension points, each a list a feature appends to when it is imported:

- *cond wrappers* ``(handle, cond) -> cond``: applied in order when an override is committed to
  its slot (a calibration gate declines where the override loses to aten). The result is what
  the generated router calls, so a wrapper costs nothing per call beyond what it adds itself.
- *impl wrappers* ``(handle, impl) -> impl``: the same for impls (checked mode compares each
  result with aten's).
- *overrides-changed listeners* ``() -> None``: told after overrides were registered or removed,
  under the registry's lock (compile mode keeps Inductor's tables in step with the overridden ops).
- *removed listeners* ``(handle) -> None``: told once per removed override, under the lock
  (calibration stops counting it as a rival).
- *slot listeners* ``(slot) -> None``: told when a slot's router is registered in the dispatcher,
  before it is taken out, and after each refresh (``slot.active`` and ``slot.traced`` then say
  what the router does). A compiled front registers above the router and follows its state.
- *call gates* (``CallGates``): how a feature's cond wrappers classify a call (size bucket and
  width class of its first tensor argument) and, for a routed cond that is one of them, the calls
  it surely declines, so a compiled front can send those to aten without entering Python (the
  calibration gate).
- *every-call impls* ``(impl) -> bool``: whether a routed impl must see every call, so that no
  front may send a call around it (checked mode's comparing wrapper).
- *held installers* ``(ops, dispatch_key) -> [installed]``: install overrides of ``ops`` held back
  at ``dispatch_key`` until asked for (unmeasured ones, asked for where they will be timed on
  first use); each installs all it holds of them or, raising, none.

Wrappers run before the dispatcher changes, so one that raises fails that registration only.
Listeners run after the change: one that raises is logged and never undoes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

log = logging.getLogger("python_native")

CondWrapper = Callable[["OverrideHandle", Any], Any]
ImplWrapper = Callable[["OverrideHandle", Any], Any]

COND_WRAPPERS: list[CondWrapper] = []
IMPL_WRAPPERS: list[ImplWrapper] = []
OVERRIDES_CHANGED: list[Callable[[], None]] = []
OVERRIDE_REMOVED: list[Callable[[OverrideHandle], None]] = []
SLOT_REGISTERED: list[Callable[[Any], None]] = []
SLOT_UNREGISTERING: list[Callable[[Any], None]] = []
SLOT_REFRESHED: list[Callable[[Any], None]] = []
EVERY_CALL: list[Callable[[Any], bool]] = []
HELD_INSTALLERS: list[Callable[[tuple[str, ...], str], list[str]]] = []


@dataclass(frozen=True)
class CallGates:
    """A feature's gates as a dispatch front sees them.

    A call's size bucket is ``numel().bit_length()`` of its first tensor argument; its rows are
    wide where that argument's last dim is at least ``wide_row``. ``masks(cond)``: for a routed
    cond that is one of the feature's gates, a function ``dispatch_key -> {dtype name: (narrow,
    wide)} | None`` giving 64-bit masks of the size buckets (0..63) where the gate surely declines
    the calls that key serves (None: nothing known, or the key's calls may run on devices the
    gate judges differently); None for any other cond.
    """

    wide_row: int
    masks: Callable[[Any], Callable[[str], dict[str, tuple[int, int]] | None] | None]


CALL_GATES: list[CallGates] = []
# Text by which the dispatcher's dump names a registration a listener makes above a router, so the
# core can tell the kernel it shadows from its own layers.
OWN_REGISTRATIONS: list[str] = []


def _add(points: list, fn: Callable[..., Any]) -> Callable[..., Any]:
    if not callable(fn):
        raise TypeError(f"an extension must be callable, got {type(fn).__name__}: {fn!r}")
    if fn not in points:  # importing a feature twice (reload) must not wrap twice
        points.append(fn)
    return fn


def wrap_conds(fn: CondWrapper) -> CondWrapper:
    """Apply ``fn(handle, cond) -> cond`` to every override committed from now on."""
    return _add(COND_WRAPPERS, fn)


def wrap_impls(fn: ImplWrapper) -> ImplWrapper:
    """Apply ``fn(handle, impl) -> impl`` to every override committed from now on."""
    return _add(IMPL_WRAPPERS, fn)


def on_overrides_changed(fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn()`` after each registration and removal."""
    return _add(OVERRIDES_CHANGED, fn)


def on_override_removed(fn: Callable[[OverrideHandle], None]) -> Callable[[OverrideHandle], None]:
    """Call ``fn(handle)`` for each override taken out."""
    return _add(OVERRIDE_REMOVED, fn)


def on_slot_registered(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Call ``fn(slot)`` right after a slot's router is registered in the dispatcher."""
    return _add(SLOT_REGISTERED, fn)


def on_slot_unregistering(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Call ``fn(slot)`` right before a slot's router is taken out of the dispatcher."""
    return _add(SLOT_UNREGISTERING, fn)


def on_slot_refreshed(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Call ``fn(slot)`` after each refresh of a slot (a registration, removal, toggle or trace)."""
    return _add(SLOT_REFRESHED, fn)


def declare_call_gates(gates: CallGates) -> CallGates:
    """Offer a feature's gates to dispatch fronts (``CallGates``)."""
    if not isinstance(gates, CallGates):
        raise TypeError(f"call gates must be a CallGates, got {type(gates).__name__}: {gates!r}")
    if gates not in CALL_GATES:
        CALL_GATES.append(gates)
    return gates


def needs_every_call(fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Ask ``fn(impl)`` whether a routed impl must see every call (no front sends a call around it)."""
    return _add(EVERY_CALL, fn)


def sees_every_call(impl: Any) -> bool:
    """Whether some feature needs ``impl`` (a routed impl) to see every call."""
    for fn in EVERY_CALL:  # a plain loop: a front asks on every refresh
        if fn(impl):
            return True
    return False


def on_install_held(fn: Callable[[tuple[str, ...], str], list[str]]) -> Callable[[tuple[str, ...], str], list[str]]:
    """Let ``fn(ops, dispatch_key)`` install the overrides of ``ops`` it holds back at that key."""
    return _add(HELD_INSTALLERS, fn)


def install_held(ops: tuple[str, ...], dispatch_key: str) -> list[str]:
    """Install every held override of ``ops`` at ``dispatch_key``; what was installed, each named.
    An installer that raises installed nothing; those before it keep what they installed."""
    done: list[str] = []
    for fn in HELD_INSTALLERS:
        done += fn(tuple(ops), dispatch_key)
    return done


def masks_of(cond: Any) -> tuple[int, Callable[[str], dict[str, tuple[int, int]] | None]] | None:
    """``(wide_row, masks for a dispatch key)`` where ``cond`` (a routed cond) is a declared gate, else None."""
    for gates in CALL_GATES:
        found = gates.masks(cond)
        if found is not None:
            return gates.wide_row, found
    return None


def remove(points: list, fn: Callable[..., Any]) -> None:
    """Unplug ``fn`` from ``points`` (a feature switched off); absent is fine."""
    if fn in points:
        points.remove(fn)


def routed_pieces(handle: OverrideHandle) -> tuple[Any, Any]:
    """``(cond, impl)`` as the router will call them: the handle's own (its chosen variant's impl),
    through every wrapper."""
    cond, impl = handle.cond, handle.chosen_impl
    if cond is not None:
        for wrap in COND_WRAPPERS:
            cond = wrap(handle, cond)
    for wrap in IMPL_WRAPPERS:
        impl = wrap(handle, impl)
    return cond, impl


def notify(listeners: list[Callable[..., None]], *args: Any) -> None:
    """Tell each listener; one that raises is logged, the others still hear."""
    for fn in listeners:
        try:
            fn(*args)
        except Exception:
            log.exception("python_native: listener %r raised", fn)
