"""The registry: every slot and override of the process, and every switch over them.

``register`` checks everything first (arguments, ordering, the features' wrappers), then commits
each piece (the functional op and its derived variants) to its slot. Every later change (a
removal, a disable, a scope, a trace) re-selects the router of the slots it touches (see
``routers``): cheap enough for toggles in hot loops. Features hear about changes through
``extensions``; the registry never names them.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from python_native.core import arguments, below, extensions, reasons, routers, slots
from python_native.core import variants as variants_
from python_native.core.handles import Cond, Impl, OrderFn, OverrideHandle
from python_native.core.index import NameIndex
from python_native.core.ordering import Ordering
from python_native.core.slots import Slot
from python_native.foundations import dsl_registry, env, schema
from python_native.foundations.dispatch_keys import check_str
from python_native.foundations.switches import Switches
from python_native.foundations.tracing import DEFAULT_CAPACITY, Trace, TraceHub

log = logging.getLogger("python_native")
_REFRESHED = extensions.SLOT_REFRESHED  # the listeners' list itself (changed in place, never rebound)
_OUTER_NAMES = below.OUTER_NAMES  # likewise


class Registry:
    """All slots and overrides of the process, and every switch over them."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.slots: dict[tuple[str, str, str], Slot] = {}
        self.index = NameIndex()
        self.ordering = Ordering()
        self.switches = Switches()
        self.traces = TraceHub()
        self.killed = env.overrides_disabled()
        self.unroutable_dsls: set[str] = set()  # DSLs whose runtime cannot run here: never routed to
        self._routability_checked: set[str] = set()  # each DSL's runtime is checked once
        self._uids = itertools.count()
        self._tombstones = routers.Tombstones()
        self._retired: dict[Slot, float] = {}  # slots left with no override, kept registered for now
        self._sweeper: threading.Timer | None = None

    # ----- activity -----

    def is_active(self, o: OverrideHandle) -> bool:
        """The activity rule; ``refresh`` inlines the same test in its loop because toggles are hot."""
        s = self.switches
        if self.killed or o.dsl in self.unroutable_dsls:
            return False
        if s.all.off or o.dsl in s.dsl.off or o.dispatch_key in s.key.off or o.variant == variants_.ATEN:
            return False
        return s.op.off.isdisjoint(o.op_names)

    # ----- registration -----

    def register(
        self,
        dsl: str,
        lib_symbol: str,
        op_symbol: str,
        dispatch_key: str,
        cond: Cond | None,
        impl: Impl,
        *,
        unconditional_override: bool = False,
        priority: int = 0,
        derive_variants: bool | Iterable[str] = False,
        impl_takes_plan: bool = False,
        explain: reasons.Explain | None = None,
        variants: Mapping[str, Impl] | None = None,
    ) -> OverrideHandle:
        dsl, lib_symbol, op_symbol, dispatch_key = arguments.check_pieces(
            dsl, lib_symbol, op_symbol, dispatch_key, cond, impl,
            unconditional=unconditional_override, priority=priority, takes_plan=impl_takes_plan,
        )
        declared = variants_.check(impl, variants)
        sig = arguments.signature(lib_symbol, op_symbol, impl_takes_plan)
        derived = arguments.derived_variants(lib_symbol, sig, derive_variants)
        explain = reasons.check_explain(explain, cond)
        pieces = [(sig, "functional")] + [(schema.signature_of(lib_symbol, op), kind) for kind, op in derived]
        for psig, _ in pieces:
            arguments.check_autograd_unchanged(lib_symbol, psig, dispatch_key)

        with self.lock:
            handles = [
                self._new_handle(dsl, lib_symbol, psig, dispatch_key, cond, impl, unconditional_override, priority,
                                 kind, impl_takes_plan)
                for psig, kind in pieces
            ]
            for h in handles:
                h.explain = explain
            primary = handles[0]
            for child in handles[1:]:
                child.derived_from = primary
                child.op_names = tuple(dict.fromkeys(child.op_names + primary.op_names))
                primary.derived.append(child)
            primary.variants = declared
            chosen = variants_.seeded(primary, self.overrides) or variants_.DEFAULT
            for handle in handles:  # derived overrides share the functional one's variants and choice
                handle.variants, handle.variant = declared, chosen
            # Everything that can fail on the user's behalf (ordering) runs before the dispatcher
            # changes; installing a slot is the last step that can fail.
            orders = [self.ordering.ordered(h.op, h.dispatch_key, self._existing(h) + [h]) for h in handles]
            handle_slots = [self._slot_for(h) for h in handles]
            for handle, slot, order in zip(handles, handle_slots, orders, strict=True):
                self._commit(handle, slot, order)
            extensions.notify(extensions.OVERRIDES_CHANGED)
        return primary

    def _existing(self, handle: OverrideHandle) -> list[OverrideHandle]:
        slot = self.slots.get((handle.lib, handle.op, handle.dispatch_key))
        return list(slot.overrides) if slot is not None else []

    def _slot_for(self, handle: OverrideHandle) -> Slot:
        slot = self.slots.get((handle.lib, handle.op, handle.dispatch_key))
        if slot is not None:
            self._retired.pop(slot, None)  # a retired slot serves again: nothing changes in the dispatcher
        else:
            slot = self._install_slot(handle.lib, schema.signature_of(handle.lib, handle.op), handle.dispatch_key)
        return slot

    def _new_handle(self, dsl, lib, sig, key, cond, impl, unconditional, priority, epilogue, takes_plan) -> OverrideHandle:
        uid = next(self._uids)
        return OverrideHandle(
            dsl=dsl, lib=lib, op=sig.qualified, dispatch_key=key, cond=cond, impl=impl,
            priority=priority, unconditional=unconditional or cond is None, takes_plan=takes_plan, uid=uid,
            name=f"{dsl}::{sig.qualified}#{uid}", op_names=tuple(dict.fromkeys((sig.qualified, sig.packet))),
            epilogue=epilogue, derived_from=None, _registry=self,
        )

    def _commit(self, handle: OverrideHandle, slot: Slot, order: list[OverrideHandle]) -> None:
        if handle.dsl not in self._routability_checked:
            self._routability_checked.add(handle.dsl)
            if not self._dsl_routable(handle.dsl):
                self.unroutable_dsls.add(handle.dsl)
        handle._slot = slot
        handle.routed_cond, handle.routed_impl = extensions.routed_pieces(handle)
        routers.bind(slot, handle)
        slot.overrides = order
        self.index.add(handle, slot)
        self.refresh(slot)

    @staticmethod
    def _dsl_routable(dsl: str) -> bool:
        module = dsl_registry.get(dsl)
        check = getattr(module, "can_register", None)
        try:
            return bool(check()) if callable(check) else dsl_registry.available(dsl)
        except Exception:
            log.exception("python_native: availability check of DSL %r raised", dsl)
            return False

    def _install_slot(self, lib: str, sig: schema.OpSignature, key: str) -> Slot:
        slot = slots.new_slot(lib, sig, key, self.traces.emit, self._recapture)
        slot.entry = routers.make_entry(slot)
        slots.register_entry(slot)
        self.slots[slot.key] = slot
        return slot

    def _recapture(self, slot: Slot, error: RuntimeError) -> bool:
        with self.lock:
            return slots.recapture(slot, error)

    def _uninstall_slot(self, slot: Slot) -> None:
        """Take ``slot``'s registration out of the dispatcher and forget the slot entirely."""
        self.slots.pop(slot.key, None)
        slots.unregister_entry(slot)
        slot.codes.clear()

    # ----- ordering -----

    def reorder(self, fn: OrderFn | None) -> None:
        """Order every slot with ``fn(op_symbol, dispatch_key, overrides) -> overrides``."""
        with self.lock:
            previous = self.ordering.swap(fn)
            try:
                new_orders = {
                    slot: self.ordering.ordered(slot.sig.qualified, slot.dispatch_key, slot.overrides, strict=True)
                    for slot in self.slots.values()
                }
            except BaseException:
                self.ordering.restore(previous)
                raise
            self.ordering.forget_failures()
            for slot, order in new_orders.items():
                slot.overrides = order
                self.refresh(slot)

    # ----- removal -----

    def remove(self, handle: OverrideHandle) -> None:
        """Take ``handle`` (and its derived variants) out; nothing of them stays reachable.

        The slot's router is swapped first, then the override's globals and every cached router
        variant naming it are dropped. A slot left with no override is uninstalled.
        """
        with self.lock:
            removed = []
            for o in (handle, *handle.derived):
                if o._removed:
                    continue
                o._removed = True
                slot = o._slot
                slot.overrides.remove(o)
                self.index.reindex(slot)
                self.refresh(slot)
                self._tombstones.bury(slot, o)
                if not slot.overrides:
                    self._retire(slot)
                removed.append(o)
            for o in removed:
                extensions.notify(extensions.OVERRIDE_REMOVED, o)
            if removed:
                extensions.notify(extensions.OVERRIDES_CHANGED)

    def _retire(self, slot: Slot) -> None:
        """A slot left with no override leaves the dispatcher, at once where no other thread can be
        calling it, else once calls have had ``RETIRE_SECONDS`` to leave (its router meanwhile only
        calls the captured kernel, and a new override of the op takes the slot back)."""
        if not self._other_threads():
            self._uninstall_slot(slot)
            return
        self._retired[slot] = time.monotonic()
        if self._sweeper is None:
            self._sweeper = threading.Timer(RETIRE_SECONDS, self._sweep_retired)
            self._sweeper.daemon = True
            self._sweeper.start()

    def _other_threads(self) -> set[int]:
        """Threads besides this one that could be inside a call (the retirement timer cannot)."""
        others = set(sys._current_frames()) - {threading.get_ident()}
        if self._sweeper is not None and self._sweeper.ident is not None:
            others.discard(self._sweeper.ident)
        return others

    def _sweep_retired(self) -> None:
        """Uninstall the retired slots whose grace has passed and whose router no thread runs."""
        with self.lock:
            self._sweeper = None
            now = time.monotonic()
            running = slots.running_codes()
            for slot, since in list(self._retired.items()):
                codes = {code for _, code in slot.codes.values()} | {slot.entry.__code__}
                if slot.overrides or now - since < RETIRE_SECONDS or codes & running:
                    continue
                del self._retired[slot]
                self._uninstall_slot(slot)
            if self._retired:
                self._sweeper = threading.Timer(RETIRE_SECONDS, self._sweep_retired)
                self._sweeper.daemon = True
                self._sweeper.start()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until every retired slot has left the dispatcher; True when none is left."""
        deadline = time.monotonic() + timeout
        while self._retired and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._retired

    # ----- routers -----

    def refresh(self, slot: Slot) -> None:
        """Swap ``slot`` to the router for its currently active overrides.

        This runs on every toggle, so the common case (a variant seen before) is a handful of
        set lookups, one dict lookup and at most one ``__code__`` assignment.
        """
        active: list[OverrideHandle] = []
        uids: list[int] = []
        s = self.switches
        op_off = s.op.off
        if not self.killed and not s.all.off:
            dsl_off, key_off, unroutable = s.dsl.off, s.key.off, self.unroutable_dsls
            for o in slot.overrides:  # a plain loop: cheaper than a comprehension on 3.10/3.11
                if (o.dsl not in dsl_off and o.dispatch_key not in key_off and o.dsl not in unroutable
                        and o.variant != "aten" and op_off.isdisjoint(o.op_names)):
                    active.append(o)
                    uids.append(o.uid)
        # A slot whose overrides were all removed is no longer routed: traces skip its calls.
        traced = self.traces.active and bool(slot.overrides)
        cache_key = (tuple(uids), traced)
        guard = False
        if op_off:  # aten all the way down below a switched-off op (see ``below``)
            guard, checked, callers = below.flags(self.slots, slot, active, op_off)
            if guard or checked:
                cache_key += (guard, checked, bool(callers))
                slot.namespace["_pn_callers"] = callers
        hit = slot.codes.get(cache_key)
        if hit is None:
            hit = routers.variant_code(slot, active, traced, cache_key, cache_key[2:] or (False, False, False))
        slot.current_source, code = hit
        if slot.entry.__code__ is not code:
            slot.entry.__code__ = code
        slot.active, slot.traced, slot.below = tuple(active), traced, guard
        if _REFRESHED:  # extensions.notify, written out: a toggle refreshes twice
            for fn in _REFRESHED:
                try:
                    fn(slot)
                except Exception:
                    log.exception("python_native: listener %r raised", fn)

    def _refresh_names(self, kind: str, names: Sequence[str]) -> None:
        touched = self.index.slots(kind, names)
        for slot in touched:
            self.refresh(slot)
        if kind == "op" and not _OUTER_NAMES.isdisjoint(names):  # the ops called inside follow (``below``)
            for slot in below.dependents(self.index, touched, names, self.slots):
                self.refresh(slot)

    def refresh_all(self) -> None:
        for slot in self.slots.values():
            self.refresh(slot)

    # ----- switches -----

    def disable(self, kind: str, names: Sequence[str]) -> None:
        with self.lock:
            self.switches.of(kind).disable(names)
            self._refresh_names(kind, names)

    def enable(self, kind: str, names: Sequence[str]) -> None:
        with self.lock:
            self.switches.of(kind).enable(names)
            self._refresh_names(kind, names)

    def hold(self, kind: str, names: Sequence[str], token: int | None = None, off: bool = True) -> int:
        """Hold ``names`` off (or on) with ``token`` (a new one when None) until ``release``."""
        with self.lock:
            if token is None:
                token = self.switches.new_token()
            self.switches.of(kind).hold(names, token, off)
            self._refresh_names(kind, names)
            return token

    def release(self, kind: str, names: Sequence[str], token: int) -> None:
        """Drop ``token``'s hold; idempotent, so a release cut short is finished by calling it again."""
        with self.lock:
            self.switches.of(kind).release(names, token)
            self._refresh_names(kind, names)

    def is_off(self, kind: str, name: str) -> bool:
        return self.switches.of(kind).is_off(name)

    def reset_switches(self) -> None:
        """Enable everything again (all explicit disables and scope holds dropped)."""
        with self.lock:
            self.switches.clear()
            self.refresh_all()

    # ----- tracing -----

    def trace(self, capacity: int = DEFAULT_CAPACITY) -> Trace:
        return Trace(self._open_trace, self._close_trace, capacity)

    def _open_trace(self, trace: Trace) -> None:
        with self.lock:
            if self.traces.add(trace):
                self.refresh_all()

    def _close_trace(self, trace: Trace) -> None:
        """Idempotent: a close cut short (an interrupt) is finished by calling it again."""
        with self.lock:
            if self.traces.remove(trace):
                self.refresh_all()

    # ----- queries -----

    def overrides(self) -> list[OverrideHandle]:
        with self.lock:
            return [o for slot in self.slots.values() for o in slot.overrides]

    def dsl_operations(self, dsl: str) -> list[str]:
        return sorted({o.op for o in self.overrides() if o.dsl == dsl})

    def known_op_names(self) -> dict[str, set[Slot]]:
        """Op names some override answers to (the index of slots by op name)."""
        return self.index.op_names()

    def router_source(self, op_symbol: str, dispatch_key: str, lib_symbol: str = "aten") -> str:
        packet, overload = schema.split_symbol(check_str(op_symbol, "op_symbol"))
        slot = self.slots.get((lib_symbol, schema.qualify(packet, overload), dispatch_key))
        if slot is None:
            raise KeyError(f"no override was ever registered for {lib_symbol}::{op_symbol} @ {dispatch_key}")
        return slot.current_source


RETIRE_SECONDS = 1.0

REGISTRY = Registry()


def _renew_locks_in_child() -> None:
    """A forked child has only the forking thread: a lock another thread held stays held forever.

    The forking thread's own hold on the registry lock is kept (it will release it); any other
    holder is gone, so the child gets fresh locks.
    """
    if not REGISTRY.lock._is_owned():
        REGISTRY.lock = threading.RLock()
    REGISTRY.traces._lock = threading.Lock()
    REGISTRY._sweeper = None  # the timer thread did not survive the fork; the next removal starts one
    slots.GRAVEYARD.renew_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_in_child)
