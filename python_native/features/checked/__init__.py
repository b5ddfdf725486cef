"""Checked mode (``PYTHON_NATIVE_CHECK=1``): every fired override is compared with aten's kernel.

When the switch is on at registration, the router calls a checking wrapper instead of the
override's impl: the impl runs on the caller's tensors, aten's captured kernel for the
*functional* op runs on clones of them (so the reference can never change the caller's data,
and derived in-place/``out=`` variants are judged by the functional result their epilogue
writes), and the two results must agree in dtype, shape, contiguity where aten's is contiguous,
and values within a per-dtype tolerance (``compare.py``). Where aten fixes no bits (the index of
a tie, a random draw) the op is judged by the contract aten keeps instead (``contracts.py``). A
disagreement raises ``OverrideMismatch`` naming the override and the difference. When the switch
is off the router binds the plain impl: nothing here runs and nothing is paid. The wrapper plugs
into the dispatch core as an impl wrapper.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from python_native.core import extensions
from python_native.foundations import env, scalars
from python_native.foundations.codegen import PLAN_KEYWORD

from . import contracts, draws, selection
from .compare import TOLERANCES, OverrideMismatch, compare
from .contracts import Contract, judge_by

__all__ = ["TOLERANCES", "Contract", "OverrideMismatch", "checking", "compare", "impl_for", "judge_by"]

# aten's ops whose bits aten leaves open (no lookup here: ``import torch`` stays cheap).
contracts.CONTRACTS.update({contracts.key("aten", op): c for rules in (selection.CONTRACTS, draws.CONTRACTS)
                            for op, c in rules.items()})

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

_state = threading.local()  # `busy`: a check is running on this thread (its own ops are not checked)
_checking: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()  # every checking wrapper alive


def impl_for(handle: OverrideHandle, impl: Callable[..., Any]) -> Callable[..., Any]:
    """What the router calls for ``handle``: ``impl`` itself, or its checking wrapper in checked mode."""
    if not env.check_overrides():
        return impl
    return checking(handle, impl)


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
    _checking.add(checked_impl)  # a compiled front must not send a call around the check
    return checked_impl


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_clone(v) for v in value)
    return value


extensions.wrap_impls(impl_for)
def _is_checking(impl: Any) -> bool:
    """Whether ``impl`` is a checking wrapper (which a compiled front must hand every call)."""
    if not _checking:  # checked mode off: asked on every refresh, answered at once
        return False
    try:
        return impl in _checking
    except TypeError:  # an unhashable callable is no wrapper of ours
        return False


extensions.needs_every_call(_is_checking)
