"""The registry: every slot and override of the process, and every switch over them.

``register`` checks everything first (arguments, ordering, the features' wrappers), then commits
each piece (the functional op and the in-place/``out=`` forms derived from it) to its slot. Every later change (a
removal, a disable, a scope, a trace) re-selects the router of the slots it touches (see
``routers``): cheap enough for toggles in hot loops. Features hear about changes through
``extensions``; the registry never names them.

A slot serves one definition of its op (``slots``): an op destroyed and defined again gets a new
slot at its next registration, and what was taken out of service is freed by ``reclaim``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from python_native.core import arguments, explainers, extensions, nested_aten, reclaim, routers, slots
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
_POINTS = extensions.POINTS  # the features' hooks (its tuples retaken at each registration, the object never)
_OUTER_NAMES = nested_aten.OUTER_NAMES  # likewise


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
        derive_forms: bool | Iterable[str] | None = None,
        impl_takes_plan: bool = False,
        explain: explainers.Explain | None = None,
        variants: Mapping[str, Impl] | None = None,
        **renamed: Any,
    ) -> OverrideHandle:
        """Register an override; the public ``pn.register_op_override`` documents the arguments
        (its signature is this one's). ``renamed`` takes the deprecated ``derive_variants``."""
        dsl, lib_symbol, op_symbol, dispatch_key = arguments.check_pieces(
            dsl, lib_symbol, op_symbol, dispatch_key, cond, impl,
            unconditional=unconditional_override, priority=priority, takes_plan=impl_takes_plan,
        )
        declared = variants_.check(impl, variants)
        sig = arguments.signature(lib_symbol, op_symbol, impl_takes_plan)
        derived = arguments.derived_forms(lib_symbol, sig, arguments.derive_forms_option(derive_forms, renamed))
        explain = explainers.check_explain(explain, cond)
        pieces = [(sig, "functional")] + [(schema.signature_of(lib_symbol, op), kind) for kind, op in derived]
        for psig, _ in pieces:
            arguments.check_autograd_unchanged(lib_symbol, psig, dispatch_key)

        with self.lock:
            handles = [
                OverrideHandle.new(next(self._uids), dsl, lib_symbol, psig, dispatch_key, cond, impl,
                                   unconditional_override, priority, kind, impl_takes_plan, self)
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
            for handle in handles:  # derived forms share the functional override's variants and choice
                handle.variants, handle.variant = declared, chosen
            # Everything that can fail on the user's behalf (ordering) runs before the dispatcher
            # changes; installing a slot is the last step that can fail. (A slot of an op defined
            # again is replaced first: it serves a definition that is gone either way.)
            for h in handles:
                self._follow_definition(h.lib, h.op, h.dispatch_key)
            orders = [self.ordering.ordered(h.op, h.dispatch_key, self._existing(h) + [h]) for h in handles]
            handle_slots = [self._slot_for(h) for h in handles]
            for handle, slot, order in zip(handles, handle_slots, orders, strict=True):
                self._commit(handle, slot, order)
            extensions.notify(_POINTS.overrides_changed)
        return primary

    def _existing(self, handle: OverrideHandle) -> list[OverrideHandle]:
        slot = self.slots.get((handle.lib, handle.op, handle.dispatch_key))
        return list(slot.overrides) if slot is not None else []

    def _slot_for(self, handle: OverrideHandle) -> Slot:
        slot = self.slots.get((handle.lib, handle.op, handle.dispatch_key))
        if slot is None:
            slot = self._install_slot(handle.lib, schema.signature_of(handle.lib, handle.op), handle.dispatch_key)
        return slot

    def _follow_definition(self, lib: str, op: str, key: str) -> None:
        """Replace the slot of ``lib::op`` at ``key`` if its op was destroyed and defined again.

        Its overrides were written for the old definition: with the same schema they move to a
        new slot over the new definition (an op whose torch object was merely dropped looks the
        same); with another schema they are removed. The old slot leaves the dispatcher first, so
        the new one captures the new definition's kernel, never the old router.
        """
        old = self.slots.get((lib, op, key))
        if old is None or not slots.redefined(old):
            return
        moving, old.overrides = old.overrides, []
        self.index.reindex(old)
        self.refresh(old)
        self._uninstall_slot(old)
        try:
            if not slots.schema_kept(old):
                raise ValueError(f"{old.op_name} was defined again with another schema")
            new = self._install_slot(lib, schema.signature_of(lib, op), key)
        except Exception as e:  # they cannot follow: removed, as ``remove`` would
            log.warning("python_native: %s; its overrides (%s) were written for the old definition and are removed",
                        e, ", ".join(o.name for o in moving))
            for o in moving:
                o._removed = True
                extensions.notify(_POINTS.override_removed, o)
            extensions.notify(_POINTS.overrides_changed)
            return
        for i, o in enumerate(moving):  # one at a time: the router names only overrides already bound
            self._commit(o, new, moving[: i + 1])

    def _commit(self, handle: OverrideHandle, slot: Slot, order: list[OverrideHandle]) -> None:
        if handle.dsl not in self._routability_checked:
            self._routability_checked.add(handle.dsl)
            if not dsl_registry.routable(handle.dsl):
                self.unroutable_dsls.add(handle.dsl)
        handle._slot = slot
        handle.routed_cond, handle.routed_impl = extensions.routed_pieces(handle)
        routers.bind(slot, handle)
        slot.overrides = order
        self.index.add(handle, slot)
        self.refresh(slot)

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
        """Take ``slot``'s registration out of the dispatcher and forget the slot entirely (a slot
        that replaced it under the same name stays)."""
        if self.slots.get(slot.key) is slot:
            del self.slots[slot.key]
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
        """Take ``handle`` (and its derived forms) out; nothing of them stays reachable.

        The slot's router is swapped first, then the override's globals become tombstones and
        every cached router variant naming it is dropped (``routers.bury``). A slot left with no
        override leaves the dispatcher at once; what a call on its way in may still need waits in
        ``reclaim`` until no call can be inside it.
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
                routers.bury(slot, o)
                if not slot.overrides:
                    self._uninstall_slot(slot)
                removed.append(o)
            for o in removed:
                extensions.notify(_POINTS.override_removed, o)
            if removed:
                extensions.notify(_POINTS.overrides_changed)

    @staticmethod
    def settle(timeout: float = 10.0) -> bool:
        """Wait until everything removed has been freed (``reclaim.settle``); True when nothing is left."""
        return reclaim.settle(timeout)

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
        if op_off:  # aten all the way down below a switched-off op (see ``nested_aten``)
            guard, checked, callers = nested_aten.flags(self.slots, slot, active, op_off)
            if guard or checked:
                cache_key += (guard, checked, bool(callers))
                slot.namespace["_pn_callers"] = callers
        hit = slot.codes.get(cache_key)
        if hit is None:
            hit = routers.variant_code(slot, active, traced, cache_key, cache_key[2:] or (False, False, False))
        slot.current_source, code = hit
        if slot.entry.__code__ is not code:
            slot.entry.__code__ = code
        slot.active, slot.traced, slot.guarded = tuple(active), traced, guard
        refreshed = _POINTS.slot_refreshed
        if refreshed:  # extensions.notify, written out: a toggle refreshes twice
            for fn in refreshed:
                try:
                    fn(slot)
                except Exception:
                    log.exception("python_native: listener %r raised", fn)

    def _refresh_names(self, kind: str, names: Sequence[str]) -> None:
        touched = self.index.slots(kind, names)
        for slot in touched:
            self.refresh(slot)
        if kind == "op" and not _OUTER_NAMES.isdisjoint(names):  # the ops called inside follow (``nested_aten``)
            for slot in nested_aten.dependents(self.index, touched, names, self.slots):
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


REGISTRY = Registry()


def _renew_locks_in_child() -> None:
    """A forked child has only the forking thread: a lock another thread held stays held forever.

    The forking thread's own hold on the registry lock is kept (it will release it); any other
    holder is gone, so the child gets fresh locks.
    """
    if not REGISTRY.lock._is_owned():
        REGISTRY.lock = threading.RLock()
    REGISTRY.traces._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_in_child)
