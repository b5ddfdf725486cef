"""The override registry: slots in the dispatcher, their overrides, and the switches over them.

A *slot* is one ``(namespace, op, dispatch key)``. The first override of a slot captures the
kernel the dispatcher had there and installs, once, a generated router (see ``codegen``). Every
later change (a registration, a removal, a disable, a scope, a trace) regenerates or re-selects
that slot's router and swaps it in through the registered function's ``__code__``. Each slot owns
one ``torch.library.Library``: removing a slot's last override destroys it, so the dispatcher is
exactly as it was before the first registration, and drops every reference the slot held.
"""

from __future__ import annotations

import builtins
import collections
import functools
import importlib
import inspect
import itertools
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.autograd.profiler as _profiler

from python_native import calibration, checked, codegen, compiled, dsl_registry, env, epilogues, scalars, schema
from python_native.switches import KINDS, Switches
from python_native.tracing import Trace, TraceHub

log = logging.getLogger("python_native")

Cond = Callable[..., bool]
Impl = Callable[..., Any]
OrderFn = Callable[[str, str, list["OverrideHandle"]], list["OverrideHandle"]]

NON_BACKEND_KEYS = frozenset(
    {
        "Meta",
        "CompositeImplicitAutograd",
        "CompositeImplicitAutogradNestedTensor",
        "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional",
    }
)
_NON_BACKEND_PREFIXES = (
    "Autograd", "Autocast", "Python", "Functionalize", "FuncTorch", "ADInplaceOrView",
    "BackendSelect", "Batched", "Vmap", "Tracer", "Named", "Conjugate", "Negative", "ZeroTensor",
    "Undefined", "PreDispatch", "Functional", "EndOf", "StartOf",
)


class OverrideHandle:
    """One registered override. ``remove()`` takes it (and variants derived from it) out."""

    __slots__ = (
        "dsl", "lib", "op", "dispatch_key", "cond", "impl", "priority", "unconditional", "takes_plan",
        "uid", "name", "op_names", "epilogue", "derived_from", "derived", "_slot", "_registry",
        "_removed",
    )

    def __init__(self, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self, key, value)
        self.derived: list[OverrideHandle] = []
        self._removed = False

    # Names torch's in-tree registry uses, so user ordering functions written for it work here.
    @property
    def dsl_name(self) -> str:
        return self.dsl

    @property
    def op_symbol(self) -> str:
        return self.op

    @property
    def cond_fn(self) -> Cond | None:
        return self.cond

    @property
    def impl_fn(self) -> Impl:
        return self.impl

    @property
    def unconditional_override(self) -> bool:
        return self.unconditional

    @property
    def removed(self) -> bool:
        return self._removed

    @property
    def active(self) -> bool:
        """Whether calls can reach this override now (not removed, nothing disables it)."""
        return not self._removed and self._registry._is_active(self)

    def remove(self) -> None:
        """Take this override out of its slot; removing twice is a no-op."""
        self._registry.remove(self)

    def __repr__(self) -> str:
        state = "removed" if self._removed else ("active" if self.active else "inactive")
        return f"<override {self.name} {self.lib}::{self.op} @ {self.dispatch_key}, {state}>"


class Slot:
    """One ``(lib, op, dispatch key)`` in the dispatcher and the overrides routed there."""

    def __init__(self, lib: str, sig: schema.OpSignature, dispatch_key: str, entry_namespace: dict):
        self.lib = lib
        self.sig = sig
        self.dispatch_key = dispatch_key
        self.namespace = entry_namespace
        self.overrides: list[OverrideHandle] = []
        self.entry: Any = None  # the function registered with the dispatcher
        self.library: torch.library.Library | None = None  # holds only this slot's registration
        self.shadowed = ""  # the dispatcher's description of the kernel the fallback captured
        self.codes: dict[tuple, tuple[str, Any]] = {}
        self.current_source = ""

    @property
    def label(self) -> str:
        return f"{self.lib}::{self.sig.qualified} @ {self.dispatch_key}"

    @property
    def file_stem(self) -> str:
        return f"{self.lib}__{self.sig.qualified.replace('.', '_')}__{self.dispatch_key}"


def _check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    return value


def _check_dispatch_key(key: Any) -> str:
    if isinstance(key, torch._C.DispatchKey):
        key = key.name
    key = _check_str(key, "dispatch_key")
    if key in NON_BACKEND_KEYS:
        raise ValueError(
            f"dispatch_key={key!r} is not allowed: overrides sit at backend keys (CPU, CUDA, XPU, ...) "
            "so that autograd and autocast keep aten's formulas above them"
        )
    known = torch._C.DispatchKey.__members__
    if key not in known:
        import difflib

        close = difflib.get_close_matches(key, list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"dispatch_key={key!r} is not a dispatch key{hint}")
    if key.startswith(_NON_BACKEND_PREFIXES):
        raise ValueError(
            f"dispatch_key={key!r} is not a backend key: overrides sit at backend keys (CPU, CUDA, XPU, ...)"
        )
    if is_functionality_key(key):
        raise ValueError(
            f"dispatch_key={key!r} names a functionality shared by many backends, not a backend key; "
            f"use a backend key (CPU, CUDA, XPU, ...) or one of its forms (e.g. {key if key != 'Dense' else ''}CUDA)"
        )
    return key


def is_functionality_key(key: str) -> bool:
    """``Dense``, ``Sparse``, ``Quantized``...: a feature of many backends, never a kernel's own key."""
    return key == "Dense" or f"{key}CPU" in torch._C.DispatchKey.__members__


class Registry:
    """All slots and overrides of the process, and every switch over them."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._slots: dict[tuple[str, str, str], Slot] = {}
        self._index: dict[str, dict[str, set[Slot]]] = {kind: {} for kind in KINDS}
        self._uids = itertools.count()
        self.switches = Switches()
        self.traces = TraceHub()
        self._killed = env.overrides_disabled()
        self._order_fn: OrderFn | None = None
        self._order_fn_loaded = False
        self._unroutable_dsls: set[str] = set()
        self._routability_checked: set[str] = set()  # each DSL's runtime is checked once
        # Globals of recently removed overrides, rebound to tombstones (see ``_forget``).
        self._tombstones: collections.deque[tuple[dict, int]] = collections.deque()

    # ----- activity -----

    def _is_active(self, o: OverrideHandle) -> bool:
        """The activity rule; ``_refresh`` inlines the same test in its loop because toggles are hot."""
        s = self.switches
        if self._killed or o.dsl in self._unroutable_dsls:
            return False
        if o.dsl in s.dsl.off or o.dispatch_key in s.key.off:
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
    ) -> OverrideHandle:
        dsl = _check_str(dsl, "dsl")
        lib_symbol = _check_str(lib_symbol, "lib_symbol")
        op_symbol = _check_str(op_symbol, "op_symbol")
        dispatch_key = _check_dispatch_key(dispatch_key)
        if cond is None and not unconditional_override:
            raise ValueError("cond=None needs unconditional_override=True (an override with no cond always runs)")
        if cond is not None and not callable(cond):
            raise TypeError(f"cond must be callable or None, got {type(cond).__name__}: {cond!r}")
        if not callable(impl):
            raise TypeError(f"impl must be callable, got {type(impl).__name__}: {impl!r}")
        if not isinstance(impl_takes_plan, bool):
            raise TypeError(f"impl_takes_plan must be a bool, got {type(impl_takes_plan).__name__}: {impl_takes_plan!r}")
        if impl_takes_plan and cond is None:
            raise ValueError("impl_takes_plan=True needs a cond: the plan the impl receives is what the cond returned")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}: {priority!r}")
        if not dsl_registry.is_known(dsl):
            raise ValueError(f"unknown DSL {dsl!r}; registered DSLs: {dsl_registry.names()} (see pn.register_dsl)")
        if lib_symbol not in schema.OVERRIDABLE_NAMESPACES:
            raise ValueError(
                f"lib_symbol={lib_symbol!r} is not a namespace python_native overrides; "
                f"allowed: {list(schema.OVERRIDABLE_NAMESPACES)}"
            )
        sig = self._signature(lib_symbol, op_symbol)
        if impl_takes_plan and any(p.name == codegen.PLAN_KEYWORD for p in sig.params):
            raise ValueError(
                f"impl_takes_plan=True cannot be used for {lib_symbol}::{sig.qualified}: it has a parameter named "
                f"{codegen.PLAN_KEYWORD!r}, the keyword the plan is passed as"
            )
        variants = self._variants(lib_symbol, sig, derive_variants)
        self._check_autograd_unchanged(lib_symbol, sig, dispatch_key)
        for _, variant in variants:
            self._check_autograd_unchanged(lib_symbol, schema.signature_of(lib_symbol, variant), dispatch_key)

        pieces = [(sig, "functional")] + [(schema.signature_of(lib_symbol, op), kind) for kind, op in variants]
        with self._lock:
            handles = [
                self._new_handle(
                    dsl, lib_symbol, psig, dispatch_key, cond, impl, unconditional_override, priority, kind,
                    impl_takes_plan,
                )
                for psig, kind in pieces
            ]
            primary = handles[0]
            for child in handles[1:]:
                child.derived_from = primary
                child.op_names = tuple(dict.fromkeys(child.op_names + primary.op_names))
                primary.derived.append(child)
            # Everything that can fail on the user's behalf (ordering) runs before the dispatcher
            # changes; installing a slot is the last step that can fail.
            orders = [self._ordered(h.op, h.dispatch_key, self._existing(h) + [h]) for h in handles]
            slots = [self._slot_for(h) for h in handles]
            for handle, slot, order in zip(handles, slots, orders, strict=True):
                self._commit(handle, slot, order)
            compiled.sync()  # pn.compile_mode="keep" follows the set of overridden ops
        return primary

    def _existing(self, handle: OverrideHandle) -> list[OverrideHandle]:
        slot = self._slots.get((handle.lib, handle.op, handle.dispatch_key))
        return list(slot.overrides) if slot is not None else []

    def _slot_for(self, handle: OverrideHandle) -> Slot:
        slot = self._slots.get((handle.lib, handle.op, handle.dispatch_key))
        if slot is None:
            slot = self._install_slot(handle.lib, schema.signature_of(handle.lib, handle.op), handle.dispatch_key)
        return slot

    def _signature(self, lib_symbol: str, op_symbol: str) -> schema.OpSignature:
        if schema.find_overload(lib_symbol, op_symbol) is None:
            close = schema.close_op_names(lib_symbol, op_symbol)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"op {lib_symbol}::{op_symbol} does not exist{hint}")
        return schema.signature_of(lib_symbol, op_symbol)

    @staticmethod
    def _check_autograd_unchanged(lib_symbol: str, sig: schema.OpSignature, dispatch_key: str) -> None:
        if not schema.autograd_would_change(lib_symbol, sig.qualified, dispatch_key):
            return
        parts = schema.decomposition_ops(lib_symbol, sig.qualified)
        instead = f"override the ops it decomposes into ({', '.join(parts)})" if parts else (
            "override the ops it decomposes into"
        )
        raise ValueError(
            f"{lib_symbol}::{sig.qualified} decomposes above autograd (CompositeImplicitAutograd) and has no "
            f"kernel of its own at {dispatch_key}: a kernel there would take "
            f"{schema.autograd_key_of(dispatch_key)} off that decomposition (to the op's own derivative, whose "
            f"backward kernel {dispatch_key} may lack, or to no gradient at all); {instead} instead"
        )

    def _variants(self, lib_symbol: str, sig: schema.OpSignature, derive: bool | Iterable[str]) -> list[tuple[str, str]]:
        if derive is False:
            return []
        if derive is True:
            kinds, required = epilogues.VARIANTS, False
        else:
            if isinstance(derive, str):
                raise TypeError(f"derive_variants must be a bool or an iterable of {epilogues.VARIANTS}, got {derive!r}")
            kinds, required = tuple(derive), True
            bad = [k for k in kinds if k not in epilogues.VARIANTS]
            if bad:
                raise ValueError(f"derive_variants: unknown variant(s) {bad}; allowed: {list(epilogues.VARIANTS)}")
        found = []
        for kind in kinds:
            variant = epilogues.find_variant(lib_symbol, sig, kind)
            if variant is None:
                if required:
                    raise ValueError(f"{lib_symbol}::{sig.qualified} has no {kind} variant to derive")
                continue
            found.append((kind, variant))
        return found

    def _new_handle(self, dsl, lib, sig, key, cond, impl, unconditional, priority, epilogue, takes_plan) -> OverrideHandle:
        uid = next(self._uids)
        return OverrideHandle(
            dsl=dsl, lib=lib, op=sig.qualified, dispatch_key=key, cond=cond, impl=impl,
            priority=priority, unconditional=unconditional or cond is None, takes_plan=takes_plan, uid=uid,
            name=f"{dsl}::{sig.qualified}#{uid}", op_names=tuple(dict.fromkeys((sig.qualified, sig.packet))),
            epilogue=epilogue, derived_from=None, _slot=None, _registry=self,
        )

    def _commit(self, handle: OverrideHandle, slot: Slot, order: list[OverrideHandle]) -> None:
        if handle.dsl not in self._routability_checked:
            self._routability_checked.add(handle.dsl)
            if not self._dsl_routable(handle.dsl):
                self._unroutable_dsls.add(handle.dsl)
        uid = handle.uid
        handle._slot = slot
        ns = slot.namespace
        ns[f"_pn_cond_{uid}"] = handle.cond
        ns[f"_pn_impl_{uid}"] = checked.impl_for(handle)  # the impl itself unless PYTHON_NATIVE_CHECK is on
        ns[f"_pn_label_{uid}"] = f"python_native::{handle.dsl}::{handle.op}"
        ns[f"_pn_event_{uid}"] = (handle.op, handle.dispatch_key, handle.dsl, "override", handle.name)
        slot.overrides = order
        for kind in KINDS:
            for name in self._names_of(handle, kind):
                self._index[kind].setdefault(name, set()).add(slot)
        self._refresh(slot)

    def _dsl_routable(self, dsl: str) -> bool:
        module = dsl_registry.get(dsl)
        check = getattr(module, "can_register", None)
        try:
            return bool(check()) if callable(check) else dsl_registry.available(dsl)
        except Exception:
            log.exception("python_native: availability check of DSL %r raised", dsl)
            return False

    def _install_slot(self, lib: str, sig: schema.OpSignature, key: str) -> Slot:
        fallback = self._current_kernel(lib, sig, key)
        namespace: dict[str, Any] = {
            "__name__": f"python_native.routers.{lib}",
            "__builtins__": builtins,
            "_pn_fallback": fallback,
            "_pn_profiler": _profiler,
            "_pn_record_function": torch.autograd.profiler.record_function,
            "_pn_trace": self.traces.emit,
            "_pn_fallback_event": (sig.qualified, key, None, "fallback", None),
            "_pn_numbers": _NUMBER_TYPES,
            "_pn_coerce": scalars.coerce,
            **epilogues.EPILOGUE_GLOBALS,
        }
        slot = Slot(lib, sig, key, namespace)  # the captured kernel lives in the namespace
        namespace["_pn_recapture"] = lambda error: self._recapture(slot, error)
        source, code = self._variant_code(slot, [], False, ((), False))
        slot.entry = codegen.make_function(code, namespace, sig, f"{slot.file_stem}")
        slot.current_source = source
        self._register_entry(slot)
        self._slots[(lib, sig.qualified, key)] = slot
        return slot

    @staticmethod
    def _current_kernel(lib: str, sig: schema.OpSignature, key: str) -> Any:
        try:
            return torch.library.get_kernel(f"{lib}::{sig.qualified}", key)
        except RuntimeError as e:
            raise ValueError(
                f"{lib}::{sig.qualified} has no kernel at {key} to fall back to, so it cannot be overridden there"
            ) from e

    @staticmethod
    def _register_entry(slot: Slot) -> None:
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
        slot.shadowed = _shadowed_kernel(slot)

    def _recapture(self, slot: Slot, error: RuntimeError) -> bool:
        """After the captured kernel raised: capture the dispatcher's kernel again if it changed.

        The kernel under ours changes when a ``torch.library.Library`` that provided it is
        destroyed; the captured one then refuses every call. Our registration is taken out to
        read the kernel now at the key, then put back. True when the caller should retry.
        """
        with self._lock:
            if slot.library is None:
                return False
            stale = "invalidated" in str(error) or _shadowed_kernel(slot) != slot.shadowed
            if not stale:
                return False
            slot.library._destroy()
            slot.library = None
            try:
                fallback = self._current_kernel(slot.lib, slot.sig, slot.dispatch_key)
            except ValueError:
                fallback = None
            finally:
                self._register_entry(slot)
            if fallback is None:
                return False
            slot.namespace["_pn_fallback"] = fallback
            return True

    def _uninstall_slot(self, slot: Slot) -> None:
        """Take ``slot``'s registration out of the dispatcher and forget the slot entirely."""
        self._slots.pop((slot.lib, slot.sig.qualified, slot.dispatch_key), None)
        library, slot.library = slot.library, None
        if library is not None:
            library._destroy()
        slot.codes.clear()

    # ----- ordering -----

    def _ordered(self, op: str, key: str, overrides: list[OverrideHandle]) -> list[OverrideHandle]:
        """Priority first (higher runs first), then registration order, then the user's function."""
        ordered = sorted(overrides, key=lambda o: (-o.priority, o.uid))
        fn = self._get_order_fn()
        if fn is None:
            return ordered
        result = list(fn(op, key, list(ordered)))
        if sorted(id(o) for o in result) != sorted(id(o) for o in ordered):
            raise ValueError(
                f"ordering function {fn!r} must return a permutation of the overrides it was given "
                f"for {op} @ {key}"
            )
        return result

    def _get_order_fn(self) -> OrderFn | None:
        """The user's ordering function from the environment, loaded once.

        A path that cannot be imported must not cost any override its place: it is reported once
        (a UserWarning naming the variable and the import error) and the default order is used.
        """
        if not self._order_fn_loaded:
            self._order_fn_loaded = True
            setting = env.order_fn_setting()
            if setting is not None:
                variable, path = setting
                try:
                    self._order_fn = _import_callable(path, variable)
                except ValueError as e:
                    warnings.warn(f"python_native: {e}; using the default order", UserWarning, stacklevel=2)
        return self._order_fn

    def reorder(self, fn: OrderFn | None) -> None:
        """Order every slot with ``fn(op_symbol, dispatch_key, overrides) -> overrides``."""
        if fn is not None and not callable(fn):
            raise TypeError(f"ordering function must be callable or None, got {type(fn).__name__}: {fn!r}")
        with self._lock:
            previous = (self._order_fn, self._order_fn_loaded)
            self._order_fn, self._order_fn_loaded = fn, True
            try:
                new_orders = {
                    slot: self._ordered(slot.sig.qualified, slot.dispatch_key, slot.overrides)
                    for slot in self._slots.values()
                }
            except BaseException:
                self._order_fn, self._order_fn_loaded = previous
                raise
            for slot, order in new_orders.items():
                slot.overrides = order
                self._refresh(slot)

    # ----- removal -----

    def remove(self, handle: OverrideHandle) -> None:
        """Take ``handle`` (and its derived variants) out; nothing of them stays reachable.

        The slot's router is swapped first, then the override's globals and every cached router
        variant naming it are dropped. A slot left with no override is uninstalled.
        """
        with self._lock:
            for o in (handle, *handle.derived):
                if o._removed:
                    continue
                o._removed = True
                slot = o._slot
                slot.overrides.remove(o)
                self._reindex(slot)
                self._refresh(slot)
                self._forget(slot, o)
                if not slot.overrides:
                    self._uninstall_slot(slot)
                if hasattr(o.cond, "calibrated_dsl"):  # a faster-rival check must not defer to it any more
                    calibration.forget_gate(o.cond.calibrated_op, o.cond.calibrated_dsl)
            compiled.sync()

    def _forget(self, slot: Slot, o: OverrideHandle) -> None:
        """Drop everything of ``o`` from ``slot``: its cached routers at once, its globals soon.

        A call that entered the router just before the removal may still look the override's
        globals up, so they are first rebound to tombstones holding nothing of the user's: a cond
        that declines, and an impl that calls the functional op again through the dispatcher
        (which now routes without ``o``). The last ``TOMBSTONES_KEPT`` removals keep them; older
        ones are deleted, so the namespace stays bounded.
        """
        uid, ns = o.uid, slot.namespace
        functional = schema.find_overload(o.lib, (o.derived_from or o).op)
        ns[f"_pn_cond_{uid}"] = _declined
        ns[f"_pn_impl_{uid}"] = functools.partial(_call_again, functional, o.takes_plan)
        ns[f"_pn_label_{uid}"] = "python_native::removed"
        ns[f"_pn_event_{uid}"] = ns["_pn_fallback_event"]
        for key in [k for k in slot.codes if uid in k[0]]:
            del slot.codes[key]
        self._tombstones.append((ns, uid))
        while len(self._tombstones) > TOMBSTONES_KEPT:
            old_ns, old_uid = self._tombstones.popleft()
            for prefix in _PER_OVERRIDE_GLOBALS:
                old_ns.pop(f"{prefix}{old_uid}", None)

    def _reindex(self, slot: Slot) -> None:
        for kind in KINDS:
            for name, slots in list(self._index[kind].items()):
                if slot in slots and not any(self._names_of(o, kind).__contains__(name) for o in slot.overrides):
                    slots.discard(slot)
                    if not slots:
                        del self._index[kind][name]

    @staticmethod
    def _names_of(o: OverrideHandle, kind: str) -> tuple[str, ...]:
        return {"dsl": (o.dsl,), "key": (o.dispatch_key,), "op": o.op_names}[kind]

    # ----- routers -----

    def _variant_code(self, slot: Slot, active: list[OverrideHandle], traced: bool, cache_key: tuple) -> tuple[str, Any]:
        """Generate and compile the router for ``active`` (cached per slot by ``cache_key``)."""
        steps = [
            codegen.RouteStep(
                cond=None if o.unconditional else f"_pn_cond_{o.uid}",
                impl=f"_pn_impl_{o.uid}",
                label=f"_pn_label_{o.uid}",
                event=f"_pn_event_{o.uid}",
                epilogue=o.epilogue,
                takes_plan=o.takes_plan and not o.unconditional,
            )
            for o in active
        ]
        names = ", ".join(o.name for o in active) or "none: every call goes to the captured kernel"
        comment = f"router for {slot.label}; overrides in order: {names}{'; traced' if traced else ''}"
        source = codegen.router_source(slot.sig, steps, traced=traced, fallback_event="_pn_fallback_event", comment=comment)
        suffix = "_".join(str(o.uid) for o in active) or "none"
        filename = f"{slot.file_stem}__{suffix}{'__traced' if traced else ''}.py"
        code = codegen.compile_router(source, f"<python_native router {filename}>")
        codegen.dump(source, filename)
        if len(slot.codes) >= 64:
            slot.codes.clear()
        slot.codes[cache_key] = (source, code)
        return source, code

    def _refresh(self, slot: Slot) -> None:
        """Swap ``slot`` to the router for its currently active overrides.

        This runs on every toggle, so the common case (a variant seen before) is a handful of
        set lookups, one dict lookup and at most one ``__code__`` assignment.
        """
        active: list[OverrideHandle] = []
        uids: list[int] = []
        if not self._killed:
            s = self.switches
            dsl_off, key_off, op_off, unroutable = s.dsl.off, s.key.off, s.op.off, self._unroutable_dsls
            for o in slot.overrides:  # a plain loop: cheaper than a comprehension on 3.10/3.11
                if (o.dsl not in dsl_off and o.dispatch_key not in key_off and o.dsl not in unroutable
                        and op_off.isdisjoint(o.op_names)):
                    active.append(o)
                    uids.append(o.uid)
        # A slot whose overrides were all removed is no longer routed: traces skip its calls.
        traced = self.traces.active and bool(slot.overrides)
        cache_key = (tuple(uids), traced)
        hit = slot.codes.get(cache_key)
        if hit is None:
            hit = self._variant_code(slot, active, traced, cache_key)
        slot.current_source, code = hit
        if slot.entry.__code__ is not code:
            slot.entry.__code__ = code

    def _refresh_names(self, kind: str, names: Iterable[str]) -> None:
        index = self._index[kind]
        if len(names) == 1:
            for slot in index.get(names[0], ()):
                self._refresh(slot)
            return
        for slot in {s for n in names for s in index.get(n, ())}:
            self._refresh(slot)

    def _refresh_all(self) -> None:
        for slot in self._slots.values():
            self._refresh(slot)

    # ----- switches -----

    def disable(self, kind: str, names: Sequence[str]) -> None:
        with self._lock:
            self.switches.of(kind).disable(names)
            self._refresh_names(kind, names)

    def enable(self, kind: str, names: Sequence[str]) -> None:
        with self._lock:
            self.switches.of(kind).enable(names)
            self._refresh_names(kind, names)

    def hold(self, kind: str, names: Sequence[str]) -> int:
        with self._lock:
            token = self.switches.new_token()
            self.switches.of(kind).hold(names, token)
            self._refresh_names(kind, names)
            return token

    def release(self, kind: str, names: Sequence[str], token: int) -> None:
        with self._lock:
            self.switches.of(kind).release(names, token)
            self._refresh_names(kind, names)

    def is_off(self, kind: str, name: str) -> bool:
        return self.switches.of(kind).is_off(name)

    def reset_switches(self) -> None:
        """Enable everything again (all explicit disables and scope holds dropped)."""
        with self._lock:
            self.switches.clear()
            self._refresh_all()

    # ----- tracing -----

    def trace(self) -> Trace:
        return Trace(self._open_trace, self._close_trace)

    def _open_trace(self, trace: Trace) -> None:
        with self._lock:
            if self.traces.add(trace):
                self._refresh_all()

    def _close_trace(self, trace: Trace) -> None:
        with self._lock:
            if self.traces.remove(trace):
                self._refresh_all()

    # ----- queries -----

    def overrides(self) -> list[OverrideHandle]:
        with self._lock:
            return [o for slot in self._slots.values() for o in slot.overrides]

    def dsl_operations(self, dsl: str) -> list[str]:
        return sorted({o.op for o in self.overrides() if o.dsl == dsl})

    def known_op_names(self) -> dict[str, set[Slot]]:
        """Op names some override answers to (the index of slots by op name)."""
        return self._index["op"]

    def router_source(self, op_symbol: str, dispatch_key: str, lib_symbol: str = "aten") -> str:
        packet, overload = schema.split_symbol(_check_str(op_symbol, "op_symbol"))
        slot = self._slots.get((lib_symbol, schema.qualify(packet, overload), dispatch_key))
        if slot is None:
            raise KeyError(f"no override was ever registered for {lib_symbol}::{op_symbol} @ {dispatch_key}")
        return slot.current_source


def _import_callable(path: str, variable: str) -> OrderFn:
    module_name, _, attr = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # whatever the user's module raises while importing
        raise ValueError(f"ordering function {path!r} (from {variable}) could not be imported: {e}") from e
    if not callable(fn):
        raise ValueError(f"ordering function {path!r} (from {variable}) is not callable: {fn!r}")
    return fn


def _shadowed_kernel(slot: Slot) -> str:
    """How the dispatcher describes the kernel right under ours at the slot's key."""
    prefix = f"{slot.dispatch_key} (inactive):"
    for line in torch._C._dispatch_dump(f"{slot.lib}::{slot.sig.qualified}").splitlines():
        if line.startswith(prefix):
            return line
    return ""


_PER_OVERRIDE_GLOBALS = ("_pn_cond_", "_pn_impl_", "_pn_label_", "_pn_event_")
TOMBSTONES_KEPT = 64


def _declined(*args: Any, **kwargs: Any) -> bool:
    """The cond of a removed override, for calls already inside the router when it went."""
    return False


def _call_again(functional: torch._ops.OpOverload, takes_plan: bool, *args: Any, **kwargs: Any) -> Any:
    """The impl of a removed override: the op through the dispatcher, which no longer routes to it
    (a plan its cond handed over is the removed override's own, not an argument of the op: dropped)."""
    if takes_plan:
        kwargs.pop(codegen.PLAN_KEYWORD, None)
    return functional(*args, **kwargs)

_NUMBER_TYPES = frozenset({bool, int, float, complex})

_ALLOW_OVERRIDE = (
    {"allow_override": True}
    if "allow_override" in inspect.signature(torch.library.Library.impl).parameters
    else {}
)

REGISTRY = Registry()


def _renew_locks_in_child() -> None:
    """A forked child has only the forking thread: a lock another thread held stays held forever.

    The forking thread's own hold on the registry lock is kept (it will release it); any other
    holder is gone, so the child gets fresh locks.
    """
    if not REGISTRY._lock._is_owned():
        REGISTRY._lock = threading.RLock()
    REGISTRY.traces._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_in_child)
