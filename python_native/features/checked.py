"""Checked mode (``PYTHON_NATIVE_CHECK=1``): every fired override is compared with aten's kernel.

When the switch is on at registration, the router calls a checking wrapper instead of the
override's impl: the impl runs on the caller's tensors, aten's captured kernel for the
*functional* op runs on clones of them (so the reference can never change the caller's data,
and derived in-place/``out=`` variants are judged by the functional result their epilogue
writes), and the two results must agree in dtype, shape, contiguity where aten's is contiguous,
and values within a per-dtype tolerance. A disagreement raises ``OverrideMismatch`` naming the
override and the difference. When the switch is off the router binds the plain impl: nothing
here runs and nothing is paid. The wrapper plugs into the dispatch core as an impl wrapper.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from python_native.core import extensions
from python_native.foundations import env, scalars
from python_native.foundations.codegen import PLAN_KEYWORD

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

# (rtol, atol) per dtype: torch.testing's defaults, widened where a kernel with a different
# accumulation order legitimately differs from aten's in the last bits.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


class OverrideMismatch(AssertionError):
    """An override's result differs from aten's kernel on the same inputs (checked mode)."""


_state = threading.local()  # `busy`: a check is running on this thread (its own ops are not checked)


def impl_for(handle: OverrideHandle, impl: Callable[..., Any]) -> Callable[..., Any]:
    """What the router calls for ``handle``: ``impl`` itself, or its checking wrapper in checked mode."""
    if not env.check_overrides():
        return impl
    return checking(handle, impl)


def checking(handle: OverrideHandle, impl: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``impl`` so that each call is compared with the functional op's captured kernel."""
    slot = handle.functional.slot
    reference = slot.namespace["_pn_fallback"]
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, handle.dispatch_key))
    coercible = [p.tensor and not p.is_out for p in slot.sig.positional]
    where = f"override {handle.name} ({handle.lib}::{handle.op} @ {handle.dispatch_key})"
    takes_plan = handle.takes_plan

    @functools.wraps(impl)
    def checked_impl(*args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "busy", False):
            return impl(*args, **kwargs)
        _state.busy = True
        try:
            ref_args = [_clone(a) for a in args]
            # A plan handed over by the cond is the override's own, not an argument of the op.
            ref_kwargs = {k: _clone(v) for k, v in kwargs.items() if not (takes_plan and k == PLAN_KEYWORD)}
            result = impl(*args, **kwargs)
            peers = [a for a in ref_args if isinstance(a, torch.Tensor)]
            for i, arg in enumerate(ref_args):
                if i < len(coercible) and coercible[i]:
                    ref_args[i] = scalars.coerce(arg, peers)
            expected = reference.call_boxed(keyset, *ref_args, **ref_kwargs)
            compare(result, expected, where)
            return result
        finally:
            _state.busy = False

    checked_impl.__python_native_checked__ = impl  # the wrapped impl, for introspection
    checked_impl.python_native_sees_every_call = True  # a compiled front must not bypass the check
    return checked_impl


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_clone(v) for v in value)
    return value


def compare(actual: Any, expected: Any, where: str) -> None:
    """Raise ``OverrideMismatch`` unless ``actual`` matches aten's ``expected`` result."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            raise OverrideMismatch(f"{where} returned {_describe(actual)}; aten returns {_describe(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare_one(a, e, f"{where}, output {i}")
        return
    _compare_one(actual, expected, where)


def _compare_one(actual: Any, expected: Any, where: str) -> None:
    if not isinstance(expected, torch.Tensor):
        if actual != expected:
            raise OverrideMismatch(f"{where} returned {actual!r}; aten returns {expected!r}")
        return
    if not isinstance(actual, torch.Tensor):
        raise OverrideMismatch(f"{where} returned {_describe(actual)}; aten returns {_describe(expected)}")
    if actual.dtype != expected.dtype:
        raise OverrideMismatch(f"{where} returned dtype {actual.dtype}; aten returns {expected.dtype}")
    if actual.shape != expected.shape:
        raise OverrideMismatch(f"{where} returned shape {tuple(actual.shape)}; aten returns {tuple(expected.shape)}")
    if actual.device != expected.device:
        raise OverrideMismatch(f"{where} returned a tensor on {actual.device}; aten returns one on {expected.device}")
    if expected.is_contiguous() and not actual.is_contiguous():
        raise OverrideMismatch(
            f"{where} returned strides {actual.stride()}; aten returns a contiguous tensor {expected.stride()}"
        )
    rtol, atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
    except AssertionError as e:
        raise OverrideMismatch(f"{where} differs from aten (rtol={rtol}, atol={atol}): {e}") from None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(_describe(v) for v in value)})"
    return "None" if value is None else f"{type(value).__name__} {value!r}"


extensions.wrap_impls(impl_for)
