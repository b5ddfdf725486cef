"""Disabled means aten all the way down: inside a disabled op's aten kernel, no override runs.

Some aten kernels call other ops through the dispatcher: on CPU, ``mean`` sums with
``sum.IntList_out``, ``index_add`` adds with ``scatter_add_``, ``native_dropout`` draws with
``bernoulli_``; a generated ``out=`` kernel calls its functional op. When such an outer op is
switched off (by the op switches, while it has no active override), its router runs aten's kernel
inside a thread-local guard (``STATE.depth``), and the routers of the ops it calls inside go
straight to aten's kernel while the guard is up: the trace shows the one fallback, nothing inside it.

``torch.nn.functional.dropout`` decomposes above the backend keys wherever aten's fused kernel does
not apply (CPU, and ``p`` of 0 or 1): no slot sees the call, so while ``dropout`` is off the router
of ``bernoulli_`` also goes to aten when the Python function calling it is that one.

Nothing here costs an untouched call: the guard is set only by the routers of switched-off outer
ops, and checked only by the routers of their inner ops, and only while an outer op is off (the
registry generates those routers in ``refresh``). Direct calls of an inner op outside a
switched-off outer op run its overrides as before.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from python_native.core.slots import Slot


class _AtenDepth(threading.local):
    """Per thread: how many switched-off outer ops are running their aten kernel now."""

    depth = 0


STATE = _AtenDepth()
# What the routers that set or check the guard name.
GLOBALS: dict[str, Any] = {"_pn_nested_aten": STATE, "_pn_getframe": sys._getframe, "_pn_callers": {}}

# aten kernels that call other overridable ops through the dispatcher: key -> {outer op: inner ops}.
# (Checked on CPU by tests/test_nested_aten.py: disabling the outer op leaves no override running inside.)
KERNEL_CALLS: dict[str, dict[str, tuple[str, ...]]] = {
    "CPU": {
        "mean.dim": ("sum.IntList_out",),
        "mean.out": ("sum.IntList_out",),
        "index_add": ("scatter_add_",),
        "index_add_": ("scatter_add_",),
        "index_add.out": ("scatter_add_",),
        "native_dropout": ("bernoulli_.float",),
    },
}
# Composite ops no slot sees, by the op whose switch governs them: (Python callers, inner ops).
COMPOSITE_CALLS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "native_dropout": ((("torch.nn.functional", "dropout"),), ("bernoulli_.float",)),
}
_COMPOSITE_NAMES = frozenset(n for op in COMPOSITE_CALLS for n in (op, op.partition(".")[0]))
_COMPOSITE_INNERS = frozenset(op for _, inners in COMPOSITE_CALLS.values() for op in inners)


_TABLE_INNERS = {key: frozenset(op for inners in calls.values() for op in inners) for key, calls in KERNEL_CALLS.items()}
_NO_LINKS: tuple[tuple[str, ...], bool] = ((), False)
# Names an op switch may hold an outer op off by: the table's, the composites', and those of every
# slot found calling others (added as found). A toggle of other names has no dependents to refresh.
OUTER_NAMES: set[str] = {n for calls in KERNEL_CALLS.values() for op in calls for n in (op, op.partition(".")[0])}
OUTER_NAMES |= _COMPOSITE_NAMES


def _named_off(op: str, op_off: set[str]) -> bool:
    return op in op_off or op.partition(".")[0] in op_off


def _slot_off(slot: Slot | None, op_off: set[str]) -> bool:
    """Whether the op switches hold ``slot``'s op off (by any name an override of it answers to)."""
    return slot is not None and any(not op_off.isdisjoint(o.op_names) for o in slot.overrides)


def links(slot: Slot) -> tuple[tuple[str, ...], bool]:
    """The ops ``slot``'s captured kernel calls through the dispatcher (as far as we know), and
    whether another op's kernel calls ``slot``'s; kept on the slot per list of overrides, since
    every toggle asks."""
    overrides = slot.overrides
    # Keyed without holding the overrides (a removed one must not stay alive through this cache).
    seen = (id(overrides), len(overrides), overrides[0].uid, overrides[-1].uid) if overrides else None
    cached = slot.__dict__.get("_pn_links")
    if cached is not None and cached[0] == seen:
        return cached[1]
    op, key = slot.sig.qualified, slot.dispatch_key
    derived = tuple(o.derived_from.op for o in overrides if o.derived_from is not None)
    outer = (*KERNEL_CALLS.get(key, {}).get(op, ()), *derived)
    inner = op in _TABLE_INNERS.get(key, ()) or op in _COMPOSITE_INNERS or any(o.derived for o in overrides)
    found = (outer, inner) if outer or inner else _NO_LINKS
    if outer:
        OUTER_NAMES.update(n for o in overrides for n in o.op_names)
    slot._pn_links = (seen, found)
    return found


def flags(slots: dict, slot: Slot, active: list, op_off: set[str]) -> tuple[bool, bool, dict[Any, str]]:
    """For ``slot``'s router while ``op_off`` holds ops off: whether it runs its captured kernel inside
    the guard (it is switched off and calls other ops), whether it checks the guard (an op calling
    it is off), and the Python callers whose calls it hands to aten (composite ops that are off)."""
    outer, inner = links(slot)
    if active:
        return (False, *_checks(slots, slot, op_off)) if inner else (False, False, {})
    return bool(outer) and _slot_off(slot, op_off), False, {}


def _checks(slots: dict, slot: Slot, op_off: set[str]) -> tuple[bool, dict[Any, str]]:
    op, key = slot.sig.qualified, slot.dispatch_key
    checked = any(
        op in inners and _slot_off(slots.get((slot.lib, outer, key)), op_off)
        for outer, inners in KERNEL_CALLS.get(key, {}).items()
    ) or any(not op_off.isdisjoint(child.op_names) for o in slot.overrides for child in o.derived)
    callers: dict[Any, str] = {}
    if op in _COMPOSITE_INNERS:
        for outer, (python, inners) in COMPOSITE_CALLS.items():
            if op in inners and _named_off(outer, op_off):
                callers.update(_codes(python))
    return checked or bool(callers), callers


def _codes(python: tuple[tuple[str, str], ...]) -> dict[Any, str]:
    """The code objects of the named Python functions (those that exist in this torch), with their names."""
    found = {}
    for module, name in python:
        code = getattr(getattr(importlib.import_module(module), name, None), "__code__", None)
        if code is not None:
            found[code] = f"{module}.{name}"
    return found


def dependents(index: Any, refreshed: Iterable[Slot], names: Sequence[str], slots: dict) -> Iterable[Slot]:
    """Slots to refresh after op switches changed ``names``, besides ``refreshed``: the ops the
    refreshed slots' kernels call, and those composite ops among ``names`` call."""
    found: dict[Slot, None] = {}
    for slot in refreshed:
        for op in links(slot)[0]:
            inner = slots.get((slot.lib, op, slot.dispatch_key))
            if inner is not None:
                found[inner] = None
    if not _COMPOSITE_NAMES.isdisjoint(names):
        for outer, (_, inners) in COMPOSITE_CALLS.items():
            if _named_off(outer, set(names)):
                found.update(dict.fromkeys(index.slots("op", list(inners))))
    if not found:
        return ()
    for slot in refreshed:
        found.pop(slot, None)
    return found
