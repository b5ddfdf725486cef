"""What a patched forward does on each call besides computing: whether the package's op serves the
call at all, the module scope, and what it tells an open trace.

A patched forward routes a call to a custom op only where an override of that op is active at
the input's dispatch key (``serves``: one dict lookup, kept current by the registry's refreshes).
Elsewhere the op would run its plain-torch reference inside a custom op (a dispatch, a backward
that recomputes, a graph Inductor cannot fuse), slower than the module's own code: so the module's
own forward runs, bit for bit the unpatched model, and an open trace hears why. Under
``torch.compile`` Dynamo reads the same dict, so where no override serves it traces the module's
own code (the compiled unpatched model) and guards on the entry: an override switched on later
recompiles.

Each patched forward runs with ``module_scope`` set to its module's qualified name, so routed calls
inside it (and the backwards of the custom ops it calls) carry that name in ``pn.trace()``. A
forward that hands a call back to the module's own code (a dtype no probe confirmed, an argument the
op does not take) says so in an open trace, as a fallback event with the reason; so does a call of a
custom op that no override can take at its key (the reference serves it). Nothing here costs more
than an attribute read while no trace is open; all state is thread-local attributes, which Dynamo
traces (a compiled patched model keeps one graph).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from python_native.core import explainers, extensions
from python_native.core.registry import REGISTRY
from python_native.foundations import custom_ops, module_scope
from python_native.patching.report import OWN_CODE

MARK = "__python_native_patch__"  # set on every forward this package installs
_scope = module_scope.scope
_traces = REGISTRY.traces


class _State(threading.local):
    def __init__(self) -> None:  # per thread, in the instance: Dynamo guards on one dict, never a class default
        self.in_caller = False  # inside a patched module whose forward calls a patched function
        self.capture: list | None = None  # the fused loss's slot for the output projection's input


state = _State()

# (custom op, dispatch key) -> whether an active override sits there; written by every refresh
# of a custom op's slot (under the registry's lock), read by every patched call.
_serving: dict[tuple[str, str], bool] = {}


def _refreshed(slot: Any) -> None:
    if slot.lib == custom_ops.NAMESPACE:
        _serving[(slot.sig.qualified, slot.dispatch_key)] = bool(slot.active)


with REGISTRY.lock:
    extensions.register(extensions.Hooks("model patching", slot_refreshed=_refreshed))
    for _slot in list(REGISTRY.slots.values()):
        _refreshed(_slot)


def custom_ops_of(names: tuple[str, ...]) -> tuple[str, ...]:
    """The custom op overloads overrides attach to for the public op ``names`` (forward and backward
    of each): what must have an active override for a patched call to take the op."""
    wanted = {*names, *(f"{n}_backward" for n in names)}
    found = [d.name for d in custom_ops.defined() if d.kind == "reference" and d.packet in wanted]
    return tuple(sorted(found, key=lambda name: "backward" in name))  # the forward first: events name it


def rule_ops(rule_names: tuple[str, ...], plan: Any) -> tuple[str, ...]:
    """``custom_ops_of`` of a rule's plan: the one op the plan names (``plan.op``), else every op of the rule."""
    op = getattr(plan, "op", None)
    return custom_ops_of((op,) if op in rule_names else rule_names)


def serves(ops: tuple[str, ...], key: str) -> bool:
    """Whether an active override of one of ``ops`` sits at dispatch key ``key``."""
    for op in ops:
        if _serving.get((op, key), False):
            return True
    return False


def serving_text(ops: tuple[str, ...], key: str) -> str:
    """What serves a routed call of ``ops`` at ``key`` now: the overrides' DSLs, or the module's own
    code and why (for the patch report)."""
    if not ops:
        return "its replacement (the rule names no custom op)"
    if not serves(ops, key):
        return f"{OWN_CODE} at {key}: {why_not_served(ops, key)}"
    dsls = [o.dsl for op in ops if (slot := REGISTRY.slots.get((custom_ops.NAMESPACE, op, key))) for o in slot.active]
    return f"{', '.join(dict.fromkeys(dsls))} override of {custom_ops.NAMESPACE}::{ops[0]} at {key}"


def install_for_timing(ops: tuple[str, ...], key: str) -> dict[str, str]:
    """Install the overrides of ``ops`` held back at dispatch key ``key`` (unmeasured kernels a
    backend leaves out at a GPU key: ``extensions.install_held``), now that ``pn.patch`` has them
    timed there on first use; per op, what the report adds. A failed install installed nothing
    (the report says why). ``pn.unpatch`` leaves them installed: gated by their first-use
    verdicts, each serves only where it measured faster, and serves other models' calls too.

    The timing compares the kernel with the op's reference, which computes what the module's own
    code computes, bit for bit; it runs at the op's gate inside the dispatcher, where the module
    is out of reach, so the module's own forward is not what it is timed against."""
    try:
        done = extensions.install_held(ops, key)
    except Exception as e:
        logging.getLogger("python_native").exception("python_native: installing the overrides of %s failed", ops)
        return dict.fromkeys(ops, f"; its held overrides failed to install at {key}, none was: {type(e).__name__}: {e}")
    found: dict[str, list[str]] = {}
    for name in done:
        dsl, op = name.split(" ", 1)
        found.setdefault(op, []).append(dsl)
    return {op: f"; {', '.join(dsls)} override of {custom_ops.NAMESPACE}::{op} installed at {key} by pn.patch, "
                "to be timed there" for op, dsls in found.items()}


def first_tensor(args: tuple, kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The call's first tensor argument: its device decides the dispatch key."""
    for value in args:
        if isinstance(value, torch.Tensor):
            return value
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            return value
    return None


def why_not_served(ops: tuple[str, ...], key: str) -> str:
    """Why no override of ``ops`` serves at ``key``: none installed, or each one's switch named."""
    off = [f"{o.dsl}: {explainers.why_off(o)}" for op in ops
           if (slot := REGISTRY.slots.get((custom_ops.NAMESPACE, op, key))) is not None for o in slot.overrides]
    if not off:
        return f"no override of {custom_ops.NAMESPACE}::{ops[0]} is installed at {key}"
    return f"no override of {custom_ops.NAMESPACE}::{ops[0]} is active at {key} ({'; '.join(dict.fromkeys(off))})"


class Installed:
    """A patched module's instance ``forward``: runs the rule's replacement in module ``name``
    (``caller``: patched functions serve it). It holds what builds the replacement (the module the
    rule took, ``owner``, the rule's ``replacement`` and plan; none for a caller, which runs its own
    forward) rather than a closure, so a copy of the model (``copy.deepcopy``, pickle,
    ``torch.save``) carries one built from the copy's modules. ``__signature__`` is the forward's
    it stands for."""

    def __init__(self, name: str, target: Any, owner: Any, replacement: Callable[..., Any] | None, plan: Any, *,
                 caller: bool = False, had_own: bool = False, previous: Any = None, ops: tuple[str, ...] = ()):
        self.name, self.target, self.owner, self.replacement, self.plan = name, target, owner, replacement, plan
        self.caller, self.had_own, self.previous = caller, had_own, previous
        self.ops = ops  # the custom ops that must be served for the replacement to run (none: always)
        self._impl: Callable[..., Any] | None = None
        self._own: Callable[..., Any] | None = None
        self.copied = False

    @property
    def __python_native_patch__(self) -> str:  # MARK
        return self.name

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.original())

    @property
    def __code__(self) -> types.CodeType:
        """The code of the forward it stands for: what tools that read a forward's code see
        (``torch.export`` names its shape environment after it)."""
        return getattr(self.original(), "__code__", type(self).__call__.__code__)

    def original(self) -> Callable[..., Any]:
        """The forward this one stands in for (the class's, bound, or the instance's before)."""
        return self.previous if self.had_own else types.MethodType(type(self.target).forward, self.target)

    def build(self) -> Callable[..., Any]:
        if self._impl is None:
            self._own = self.original()  # made here, outside any compiled frame (Dynamo cannot build a method)
            if self.replacement is None:
                self._impl = self.original()
            else:
                made = self.replacement(self.owner, self.plan)
                self._impl = made[self.target] if isinstance(made, Mapping) else made
        return self._impl

    def retire(self) -> None:
        """Unpatched: where this forward is still held (a shallow copy's own ``forward``), it runs
        the forward it stood for."""
        self._impl = self._own = self.original()
        self.ops, self.caller = (), False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_impl": None, "_own": None}  # a copy builds its own from its modules

    def __setstate__(self, state: dict[str, Any]) -> None:
        # ``copied``: held by a copy (the copy's own patch, or no patch's where a submodule was copied)
        self.__dict__.update({"ops": (), "_own": None, **state, "copied": True})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        impl = self._impl if self._impl is not None else self.build()
        ops, key = self.ops, None
        if ops:
            where = first_tensor(args, kwargs)
            if where is not None and not serves(ops, key := device_key(where)):
                impl = self._own
            else:
                key = None
        previous = _scope.name
        _scope.name = self.name
        if key is not None and _traces.active:  # inside the scope: the event names this module
            _traces.emit((ops[0], key, None, "fallback", None, None),
                         f"patch: {why_not_served(ops, key)}: the module's own forward ran")
        caller = self.caller
        if caller:
            was_caller = state.in_caller
            state.in_caller = True
        try:
            return impl(*args, **kwargs)
        finally:
            _scope.name = previous
            if caller:
                state.in_caller = was_caller

    def __repr__(self) -> str:
        return f"<python_native patched forward of {self.name}>"


def own_forward(module: Any) -> Callable[..., Any]:
    """``module``'s forward as it is unpatched: what a replacement hands calls back to."""
    current = module.__dict__.get("forward")
    return current.original() if isinstance(current, Installed) else module.forward


def dispatcher(original: Callable[..., Any], replacement: Callable[..., Any],
               ops: tuple[str, ...] = ()) -> Callable[..., Any]:
    """What stands for a patched module-level function: the replacement inside patched callers
    where an override of ``ops`` serves the call (``serves``), the original everywhere else
    (another model of the same family keeps its own results)."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if state.in_caller:
            where = first_tensor(args, kwargs) if ops else None
            if where is None or serves(ops, key := device_key(where)):
                return replacement(*args, **kwargs)
            if _traces.active:
                _traces.emit((ops[0], key, None, "fallback", None, None),
                             f"patch: {why_not_served(ops, key)}: the function's own code ran")
        return original(*args, **kwargs)

    setattr(call, MARK, "function")
    call.__python_native_original__ = original
    return call


def device_key(t: torch.Tensor) -> str:
    return "CPU" if t.device.type == "cpu" else t.device.type.upper()


def declined(op: str, where: torch.Tensor, reason: str) -> None:
    """The patched forward ran the module's own code instead of ``op``: an open trace hears why."""
    if _traces.active:
        _traces.emit((op, device_key(where), None, "fallback", None, None), f"patch: {reason}")


def routing(op: str, where: torch.Tensor) -> None:
    """Before a call of custom op ``op``: where no override is installed at its key, no router
    records it, so an open trace hears here that the reference serves it."""
    if _traces.active:
        key = device_key(where)
        slot = REGISTRY.slots.get((custom_ops.NAMESPACE, op, key))
        if slot is None or not slot.overrides:
            _traces.emit((op, key, None, "fallback", None, None),
                         f"no override of {custom_ops.NAMESPACE}::{op} is installed at {key}: the reference ran")
