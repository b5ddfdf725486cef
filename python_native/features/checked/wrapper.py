"""Checked mode's comparing wrapper: what the router calls in place of an override's impl.

Loaded with the first override registered in checked mode (``impl_for``), or the first access to
the package's comparison names: a process that never checks never imports the contracts.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from python_native.foundations import scalars
from python_native.foundations.codegen import PLAN_KEYWORD

from . import contracts, draws, selection
from .compare import TOLERANCES, OverrideMismatch, compare
from .contracts import Contract, judge_by

__all__ = ["TOLERANCES", "CHECKING", "Contract", "OverrideMismatch", "checking", "compare", "contracts", "draws",
           "judge_by", "selection"]

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

# aten's ops whose bits aten leaves open (no lookup here: ``import torch`` stays cheap).
contracts.CONTRACTS.update({contracts.key("aten", op): c for rules in (selection.CONTRACTS, draws.CONTRACTS)
                            for op, c in rules.items()})

_state = threading.local()  # `busy`: a check is running on this thread (its own ops are not checked)
CHECKING: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()  # every checking wrapper alive


def checking(handle: OverrideHandle, impl: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``impl`` so that each call is compared with the functional op's captured kernel, or
    judged by the op's contract where it has one."""
    functional = handle.functional
    slot = functional.slot
    fallback = slot.namespace["_pn_fallback"]
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, handle.dispatch_key))
    coercible = [p.tensor and not p.is_out for p in slot.sig.positional]
    where = f"override {handle.name} ({handle.lib}::{handle.op} @ {handle.dispatch_key})"
    takes_plan = handle.takes_plan
    contract = contracts.contract_for(functional.lib, functional.op)

    @functools.wraps(impl)
    def checked_impl(*args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "busy", False):
            return impl(*args, **kwargs)
        _state.busy = True
        try:
            ref_args = [_clone(a) for a in args]
            # A plan handed over by the cond is the override's own, not an argument of the op.
            ref_kwargs = {k: _clone(v) for k, v in kwargs.items() if not (takes_plan and k == PLAN_KEYWORD)}
            peers = [a for a in ref_args if isinstance(a, torch.Tensor)]
            for i, arg in enumerate(ref_args):
                if i < len(coercible) and coercible[i]:
                    ref_args[i] = scalars.coerce(arg, peers)

            def reference() -> Any:
                return fallback.call_boxed(keyset, *ref_args, **ref_kwargs)

            if contract is None:
                result = impl(*args, **kwargs)
                compare(result, reference(), where)
                return result
            call = contracts.Call(slot.sig, ref_args, ref_kwargs)
            if contract.seeded:
                result, expected = draws.run_seeded(impl, args, kwargs, reference, call, where)
            else:
                result, expected = impl(*args, **kwargs), reference()
            contract.judge(call, result, expected, where)
            return result
        finally:
            _state.busy = False

    checked_impl.__python_native_checked__ = impl  # the wrapped impl, for introspection
    CHECKING.add(checked_impl)  # a compiled front must not send a call around the check
    return checked_impl


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_clone(v) for v in value)
    return value
