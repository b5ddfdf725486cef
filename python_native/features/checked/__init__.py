"""Checked mode (``PYTHON_NATIVE_CHECK=1``): every fired override is compared with aten's kernel.

When the switch is on at registration, the router calls a checking wrapper instead of the
override's impl: the impl runs on the caller's tensors, aten's captured kernel for the
*functional* op runs on clones of them (so the reference can never change the caller's data,
and derived in-place/``out=`` forms are judged by the functional result their epilogue
writes), and the two results must agree in dtype, shape, contiguity where aten's is contiguous,
and values within a per-dtype tolerance (``compare.py``). Where aten fixes no bits (the index of
a tie, a random draw) the op is judged by the contract aten keeps instead (``contracts.py``). A
disagreement raises ``OverrideMismatch`` naming the override and the difference. When the switch
is off the router binds the plain impl: nothing here runs and nothing is paid. The wrapper plugs
into the dispatch core as an impl wrapper (``extensions.Hooks``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from python_native.core import extensions
from python_native.foundations import env

__all__ = ["TOLERANCES", "Contract", "OverrideMismatch", "checking", "compare", "impl_for", "judge_by"]

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

# What a check needs (``wrapper``, the contracts, the comparison) is loaded with the first checking
# wrapper or the first access to these names: with the switch off, nothing of it is imported.
_LAZY = ("TOLERANCES", "Contract", "OverrideMismatch", "checking", "compare", "judge_by", "contracts", "draws",
         "selection")
_wrapper: ModuleType | None = None


def _load() -> ModuleType:
    """Import the comparing wrapper and bind the names of ``_LAZY`` here, as ``wrapper`` has them (a
    submodule's import alone would leave ``compare`` naming the module, not the function)."""
    global _wrapper
    if _wrapper is None:
        from python_native.features.checked import wrapper

        globals().update({name: getattr(wrapper, name) for name in _LAZY})
        _wrapper = wrapper
    return _wrapper


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def impl_for(handle: OverrideHandle, impl: Callable[..., Any]) -> Callable[..., Any]:
    """What the router calls for ``handle``: ``impl`` itself, or its checking wrapper in checked mode."""
    if not env.check_overrides():
        return impl
    return _load().checking(handle, impl)


def _is_checking(impl: Any) -> bool:
    """Whether ``impl`` is a checking wrapper (which a compiled front must hand every call)."""
    if _wrapper is None or not _wrapper.CHECKING:  # checked mode off: asked on every refresh, answered at once
        return False
    try:
        return impl in _wrapper.CHECKING
    except TypeError:  # an unhashable callable is no wrapper of ours
        return False


def _unwrap(impl: Any) -> Any:
    """The impl a checking wrapper compares (None: ``impl`` is no checking wrapper)."""
    return impl.__wrapped__ if _is_checking(impl) else None


# Order 0: the check sits innermost, so what it compares is the override's own result.
extensions.register(extensions.Hooks("checked mode", order=0, wrap_impl=impl_for, unwrap=_unwrap,
                                     every_call=_is_checking))
