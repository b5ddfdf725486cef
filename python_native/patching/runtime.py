"""What a patched forward does on each call besides computing: the module scope, and what it tells
an open trace.

Each patched forward runs with ``module_scope`` set to its module's qualified name, so routed calls
inside it (and the backwards of the declared ops it calls) carry that name in ``pn.trace()``. A
forward that hands a call back to the module's own code (a dtype no probe confirmed, an argument the
op does not take) says so in an open trace, as a fallback event with the reason; so does a call of a
declared op that no override can take at its key (the reference serves it). Nothing here costs more
than an attribute read while no trace is open; all state is thread-local attributes, which Dynamo
traces (a compiled patched model keeps one graph).
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from python_native.core.registry import REGISTRY
from python_native.foundations import declared, module_scope

MARK = "__python_native_patch__"  # set on every forward this package installs
_scope = module_scope.scope
_traces = REGISTRY.traces


class _State(threading.local):
    in_caller: bool = False  # inside a patched module whose forward calls a patched function
    capture: list | None = None  # the fused loss's slot for the output projection's input


state = _State()


class Installed:
    """A patched module's instance ``forward``: runs the rule's replacement in module ``name``
    (``caller``: patched functions serve it). It holds what builds the replacement (the module the
    rule took, ``owner``, the rule's ``replacement`` and plan; none for a caller, which runs its own
    forward) rather than a closure, so a copy of the model (``copy.deepcopy``, pickle,
    ``torch.save``) carries one built from the copy's modules. ``__signature__`` is the forward's
    it stands for."""

    def __init__(self, name: str, target: Any, owner: Any, replacement: Callable[..., Any] | None, plan: Any, *,
                 caller: bool = False, had_own: bool = False, previous: Any = None):
        self.name, self.target, self.owner, self.replacement, self.plan = name, target, owner, replacement, plan
        self.caller, self.had_own, self.previous = caller, had_own, previous
        self._impl: Callable[..., Any] | None = None

    @property
    def __python_native_patch__(self) -> str:  # MARK
        return self.name

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.original())

    def original(self) -> Callable[..., Any]:
        """The forward this one stands in for (the class's, bound, or the instance's before)."""
        return self.previous if self.had_own else types.MethodType(type(self.target).forward, self.target)

    def build(self) -> Callable[..., Any]:
        if self._impl is None:
            if self.replacement is None:
                self._impl = self.original()
            else:
                made = self.replacement(self.owner, self.plan)
                self._impl = made[self.target] if isinstance(made, Mapping) else made
        return self._impl

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_impl": None}  # a copy builds its own from its modules

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        impl = self._impl if self._impl is not None else self.build()
        previous = _scope.name
        _scope.name = self.name
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


def dispatcher(original: Callable[..., Any], replacement: Callable[..., Any]) -> Callable[..., Any]:
    """What stands for a patched module-level function: the replacement inside patched callers,
    the original everywhere else (another model of the same family keeps its own results)."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if state.in_caller:
            return replacement(*args, **kwargs)
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
    """Before a call of declared ``op``: where no override is installed at its key, no router
    records it, so an open trace hears here that the reference serves it."""
    if _traces.active:
        key = device_key(where)
        slot = REGISTRY.slots.get((declared.NAMESPACE, op, key))
        if slot is None or not slot.overrides:
            _traces.emit((op, key, None, "fallback", None, None),
                         f"no override of {declared.NAMESPACE}::{op} is installed at {key}: the reference ran")
