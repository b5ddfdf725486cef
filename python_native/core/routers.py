"""The router life cycle of a slot: generate, cache, swap in; and tombstones for removed overrides.

A slot's router is regenerated for each set of active overrides (and traced or not) and cached
per slot, so a toggle back to a set seen before is a dict lookup and one ``__code__`` assignment.
Each override's pieces live in the slot's namespace as ``_pn_cond_<uid>``, ``_pn_impl_<uid>``,
``_pn_label_<uid>``, ``_pn_event_<uid>`` and ``_pn_explain_<uid>`` (asked by traced routers only,
on a decline): the generated code names them, never the handle.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from python_native.core import explainers, nested_aten, reclaim
from python_native.core.handles import OverrideHandle
from python_native.core.slots import Slot
from python_native.foundations import codegen, schema

MAX_CACHED_ROUTERS = 64
_PER_OVERRIDE_GLOBALS = ("_pn_cond_", "_pn_impl_", "_pn_label_", "_pn_event_", "_pn_explain_")


def bind(slot: Slot, handle: OverrideHandle) -> None:
    """Put ``handle``'s routed pieces (its chosen variant's impl) into the slot's namespace under its uid."""
    uid, ns = handle.uid, slot.namespace
    ns[f"_pn_cond_{uid}"] = handle.routed_cond
    ns[f"_pn_impl_{uid}"] = handle.routed_impl
    ns[f"_pn_label_{uid}"] = f"python_native::{handle.dsl}::{handle.op}"
    ns[f"_pn_event_{uid}"] = (handle.op, handle.dispatch_key, handle.dsl, "override", handle.name, handle.variant)
    ns[f"_pn_explain_{uid}"] = explainers.explainer(handle)


def variant_code(slot: Slot, active: list[OverrideHandle], traced: bool, cache_key: tuple,
                 guard: tuple[bool, bool, bool] = (False, False, False)) -> tuple[str, Any]:
    """Generate and compile the router for ``active`` (cached per slot by ``cache_key``);
    ``guard``: whether it sets, checks, and checks by caller the guard of ``core.nested_aten``."""
    steps = [
        codegen.RouteStep(
            cond=None if o.unconditional else f"_pn_cond_{o.uid}",
            impl=f"_pn_impl_{o.uid}",
            label=f"_pn_label_{o.uid}",
            event=f"_pn_event_{o.uid}",
            epilogue=o.epilogue,
            takes_plan=o.takes_plan and not o.unconditional,
            explain=f"_pn_explain_{o.uid}",
            dsl=o.dsl,
        )
        for o in active
    ]
    names = ", ".join(o.name for o in active) or "none: every call goes to the captured kernel"
    comment = f"router for {slot.label}; overrides in order: {names}{'; traced' if traced else ''}"
    guards, checked, callers = guard
    source = codegen.router_source(slot.sig, steps, traced=traced, fallback_event="_pn_fallback_event", comment=comment,
                                   guarded=guards, checked=checked, callers=callers)
    suffix = "_".join(str(o.uid) for o in active) or "none"
    marks = "".join(m for m, on in (("__traced", traced), ("__guarded", guards), ("__checked", checked)) if on)
    filename = f"{slot.file_stem}__{suffix}{marks}.py"
    # The code's file name is the slot's, not the active set's: a name per set would be a new
    # string kept by the interpreter for every registration; the source's first line names them.
    code = codegen.compile_router(source, f"<python_native router {slot.file_stem}>")
    codegen.dump(source, filename)
    if len(slot.codes) >= MAX_CACHED_ROUTERS:
        slot.codes.clear()
    slot.codes[cache_key] = (source, code)
    return source, code


def make_entry(slot: Slot) -> types.FunctionType:
    """The function the dispatcher will call for ``slot``, routing to no override yet."""
    slot.namespace[codegen.REASON_GLOBAL] = functools.partial(explainers.fallback_reason, slot)
    slot.namespace[codegen.UNAVAILABLE_REASON_GLOBAL] = explainers.unavailable
    slot.namespace.update(nested_aten.GLOBALS)
    source, code = variant_code(slot, [], False, ((), False))
    slot.current_source = source
    return codegen.make_function(code, slot.namespace, slot.sig, slot.file_stem)


def bury(slot: Slot, o: OverrideHandle) -> None:
    """Drop everything of the removed ``o`` from ``slot``: its cached routers at once, its globals once
    no call can look them up (``reclaim``).

    A call that entered the router just before the removal may still look the override's globals
    up, so until then they are *tombstones*: a cond that declines and an impl that calls the
    functional op again through the dispatcher (which now routes without it), holding nothing of
    the user's.
    """
    uid, ns = o.uid, slot.namespace
    functional = schema.find_overload(o.lib, o.functional.op)
    ns[f"_pn_cond_{uid}"] = declined
    ns[f"_pn_impl_{uid}"] = functools.partial(call_again, functional, o.takes_plan)
    ns[f"_pn_label_{uid}"] = "python_native::removed"
    ns[f"_pn_event_{uid}"] = ns["_pn_fallback_event"]
    ns[f"_pn_explain_{uid}"] = removed_reason
    for key in [k for k in slot.codes if uid in k[0]]:
        del slot.codes[key]
    reclaim.retire(f"globals of {o.name}", namespaces=(ns,), release=functools.partial(_forget, ns, uid))


def _forget(ns: dict, uid: int) -> None:
    for prefix in _PER_OVERRIDE_GLOBALS:
        ns.pop(f"{prefix}{uid}", None)


def declined(*args: Any, **kwargs: Any) -> bool:
    """The cond of a removed override, for calls already inside the router when it went."""
    return False


def removed_reason(*args: Any, **kwargs: Any) -> str:
    """The explainer of a removed override, for calls already inside the router when it went."""
    return "removed"


def call_again(functional: torch._ops.OpOverload, takes_plan: bool, *args: Any, **kwargs: Any) -> Any:
    """The impl of a removed override: the op through the dispatcher, which no longer routes to it
    (a plan its cond handed over is the removed override's own, not an argument of the op: dropped)."""
    if takes_plan:
        kwargs.pop(codegen.PLAN_KEYWORD, None)
    return functional(*args, **kwargs)
