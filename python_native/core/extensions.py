"""Where features plug into the dispatch core, which never names them.

A feature plugs in once, when it is imported: ``register(Hooks(name, ...))``, one object naming
everything the feature adds (every field optional):

- ``wrap_cond`` ``(handle, cond) -> cond``: applied when an override is committed to its slot (a
  calibration gate declines where the override loses to aten). The result is what the generated
  router calls, so a wrapper costs nothing per call beyond what it adds itself.
- ``wrap_impl`` ``(handle, impl) -> impl``: the same for impls (checked mode compares each result
  with aten's; replay records a call's launches).
- ``unwrap`` ``(routed) -> inner | None``: the cond or impl a routed one of this feature's wraps
  (None: not one of its wrappers), so ``pn.explain`` can name each layer of a routed call.
- ``overrides_changed`` ``() -> None``: told after overrides were registered or removed, under the
  registry's lock (compile mode keeps Inductor's tables in step with the overridden ops).
- ``override_removed`` ``(handle) -> None``: told once per removed override, under the lock
  (calibration stops counting it as a rival).
- ``slot_registered`` / ``slot_unregistering`` / ``slot_refreshed`` ``(slot) -> None``: told when a
  slot's router is registered in the dispatcher, before it is taken out, and after each refresh
  (``slot.active`` and ``slot.traced`` then say what the router does). A compiled front registers
  above the router and follows its state.
- ``call_gates`` (``CallGates``): how the feature's cond wrappers classify a call, and for a routed
  cond that is one of them, the calls it surely declines, so a compiled front can send those to
  aten without entering Python (the calibration gate).
- ``every_call`` ``(impl) -> bool``: whether a routed impl must see every call, so that no front
  may send a call around it (checked mode's comparing wrapper).
- ``install_held`` ``(ops, dispatch_key) -> [installed]``: install overrides of ``ops`` held back
  at ``dispatch_key`` until asked for (unmeasured ones, timed on first use); each installs all it
  holds of them or, raising, none.
- ``own_registration`` ``() -> str | None``: the text by which the dispatcher's dump names what the
  feature registers above a router, so the core can tell the kernel it shadows from its own layers.
- ``status`` ``() -> section``: the feature's section of ``pn.status()``, under the key
  ``status_key`` (default: the feature's name): plain, JSON-able data (a dict of str, numbers,
  bools, None, lists and dicts as a rule; a list of str is shown line by line), gathered on every
  ``pn.status()`` and ``python -m python_native status``, so the panel shows each feature's status
  without naming it. It should import nothing heavy before it is called; one that raises becomes
  a problem of the report naming the feature, and the rest of the report stands.

Hooks run in ``(order, name)`` order, whatever order the features were imported in: an impl
wrapper of a lower ``order`` sits inside one of a higher. Each point is a tuple, taken again at
every ``register``: the core iterates it without a lookup per hook, and only at commit time for the
wrappers, never per call. Wrappers run before the dispatcher changes, so one that raises fails that
registration only. Listeners run after the change: one that raises is logged and never undoes it.
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


# The callable fields of ``Hooks``, in the order the module docstring gives them.
_CALLABLES = ("wrap_cond", "wrap_impl", "unwrap", "overrides_changed", "override_removed", "slot_registered",
              "slot_unregistering", "slot_refreshed", "every_call", "install_held", "own_registration", "status")


@dataclass(frozen=True)
class Hooks:
    """Everything one feature plugs into the core (see the module docstring for each field)."""

    name: str
    order: int = 0
    wrap_cond: CondWrapper | None = None
    wrap_impl: ImplWrapper | None = None
    unwrap: Callable[[Any], Any] | None = None
    overrides_changed: Callable[[], None] | None = None
    override_removed: Callable[[OverrideHandle], None] | None = None
    slot_registered: Callable[[Any], None] | None = None
    slot_unregistering: Callable[[Any], None] | None = None
    slot_refreshed: Callable[[Any], None] | None = None
    every_call: Callable[[Any], bool] | None = None
    install_held: Callable[[tuple[str, ...], str], list[str]] | None = None
    own_registration: Callable[[], str | None] | None = None
    status: Callable[[], Any] | None = None
    status_key: str | None = None
    call_gates: CallGates | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a feature's hooks need a non-empty name, got {self.name!r}")
        if not isinstance(self.order, int) or isinstance(self.order, bool):
            raise TypeError(f"hooks {self.name!r}: order must be an int, got {type(self.order).__name__}: {self.order!r}")
        for field in _CALLABLES:
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise TypeError(f"hooks {self.name!r}: {field} must be callable or None, "
                                f"got {type(value).__name__}: {value!r}")
        if self.status_key is not None and (not isinstance(self.status_key, str) or not self.status_key.strip()):
            raise TypeError(f"hooks {self.name!r}: status_key must be a non-empty str or None, "
                            f"got {type(self.status_key).__name__}: {self.status_key!r}")
        if self.call_gates is not None and not isinstance(self.call_gates, CallGates):
            raise TypeError(f"hooks {self.name!r}: call_gates must be a CallGates or None, "
                            f"got {type(self.call_gates).__name__}: {self.call_gates!r}")


class _Points:
    """Per field of ``Hooks``, the registered features' values in hook order (never None)."""

    __slots__ = (*_CALLABLES, "call_gates")

    def __init__(self) -> None:
        for field in self.__slots__:
            setattr(self, field, ())


POINTS = _Points()  # one object, rebound never: the core may keep it and read its tuples
_HOOKS: dict[str, Hooks] = {}


def register(hooks: Hooks) -> Hooks:
    """Plug a feature in: its hooks apply to every override committed and every event from now on."""
    if not isinstance(hooks, Hooks):
        raise TypeError(f"register takes a Hooks, got {type(hooks).__name__}: {hooks!r}")
    if hooks.name in _HOOKS:
        raise ValueError(f"hooks named {hooks.name!r} are already registered (registered: {sorted(_HOOKS)}); "
                         "a feature registers once, under a name of its own")
    taken = {_key(h): h.name for h in _HOOKS.values() if h.status is not None}
    if hooks.status is not None and _key(hooks) in taken:
        raise ValueError(f"hooks {hooks.name!r}: status key {_key(hooks)!r} is taken by the hooks "
                         f"{taken[_key(hooks)]!r}; status keys taken: {sorted(taken)}")
    _HOOKS[hooks.name] = hooks
    _snapshot()
    return hooks


def unregister(name: str) -> None:
    """Unplug the feature registered as ``name`` (overrides committed before keep their wrappers)."""
    if name not in _HOOKS:
        raise ValueError(f"no hooks named {name!r} are registered; registered: {sorted(_HOOKS)}")
    del _HOOKS[name]
    _snapshot()


def registered() -> tuple[Hooks, ...]:
    """Every registered feature's hooks, in hook order."""
    return tuple(sorted(_HOOKS.values(), key=lambda h: (h.order, h.name)))


def _snapshot() -> None:
    ordered = registered()
    for field in _Points.__slots__:
        setattr(POINTS, field, tuple(value for h in ordered if (value := getattr(h, field)) is not None))


def sees_every_call(impl: Any) -> bool:
    """Whether some feature needs ``impl`` (a routed impl) to see every call."""
    for fn in POINTS.every_call:  # a plain loop: a front asks on every refresh
        if fn(impl):
            return True
    return False


def install_held(ops: tuple[str, ...], dispatch_key: str) -> list[str]:
    """Install every held override of ``ops`` at ``dispatch_key``; what was installed, each named.
    An installer that raises installed nothing; those before it keep what they installed."""
    done: list[str] = []
    for fn in POINTS.install_held:
        done += fn(tuple(ops), dispatch_key)
    return done


def masks_of(cond: Any) -> tuple[int, Callable[[str], dict[str, tuple[int, int]] | None]] | None:
    """``(wide_row, masks for a dispatch key)`` where ``cond`` (a routed cond) is a declared gate, else None."""
    for gates in POINTS.call_gates:
        found = gates.masks(cond)
        if found is not None:
            return gates.wide_row, found
    return None


def wide_row() -> int:
    """The width class of the first feature's call gates (0: no feature declares any)."""
    gates = POINTS.call_gates
    return gates[0].wide_row if gates else 0


def own_registrations() -> tuple[str, ...]:
    """The texts naming what features registered above routers (see ``Hooks.own_registration``)."""
    return tuple(text for fn in POINTS.own_registration if (text := fn()))


def routed_pieces(handle: OverrideHandle) -> tuple[Any, Any]:
    """``(cond, impl)`` as the router will call them: the handle's own (its chosen variant's impl),
    through every wrapper."""
    cond = handle.cond
    if cond is not None:
        for wrap in POINTS.wrap_cond:
            cond = wrap(handle, cond)
    return cond, routed_impl(handle)


def routed_impl(handle: OverrideHandle) -> Any:
    """The chosen variant's impl as the router calls it (through every impl wrapper)."""
    impl = handle.chosen_impl
    for wrap in POINTS.wrap_impl:
        impl = wrap(handle, impl)
    return impl


def layers(routed: Any) -> list[tuple[str, Any]]:
    """``[(feature, layer), ...]``: a routed cond or impl peeled by each feature's ``unwrap``, the
    outermost first, ending with ``("", what was registered)``."""
    found: list[tuple[str, Any]] = []
    for _ in range(64):  # more layers than that is a cycle of unwraps
        for h in registered():
            inner = h.unwrap(routed) if h.unwrap is not None else None
            if inner is not None and inner is not routed:
                found.append((h.name, routed))
                routed = inner
                break
        else:
            break
    found.append(("", routed))
    return found


def _key(hooks: Hooks) -> str:
    return hooks.status_key or hooks.name


def status_sections() -> list[tuple[str, str, Callable[[], Any]]]:
    """``(feature, key, status)`` for each feature with a status section, in hook order: the
    snapshot calls each and files its result under ``key``."""
    return [(h.name, _key(h), h.status) for h in registered() if h.status is not None]


def notify(listeners: tuple[Callable[..., None], ...], *args: Any) -> None:
    """Tell each listener; one that raises is logged, the others still hear."""
    for fn in listeners:
        try:
            fn(*args)
        except Exception:
            log.exception("python_native: listener %r raised", fn)
