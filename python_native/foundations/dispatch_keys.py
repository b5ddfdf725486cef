"""Which dispatch keys an override may sit at: backend keys only.

Overrides sit below autograd and autocast (at ``CPU``, ``CUDA``, ``XPU``...), so those keep
aten's formulas above them. The registry refuses other keys at registration; the panel checks the
keys users switch with the same rule and warns about a key that can never hold an override.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Iterable
from typing import Any

import torch

NON_BACKEND_KEYS = frozenset(
    {
        "Meta",
        "CompositeImplicitAutograd",
        "CompositeImplicitAutogradNestedTensor",
        "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional",
    }
)
NON_BACKEND_PREFIXES = (
    "Autograd", "Autocast", "Python", "Functionalize", "FuncTorch", "ADInplaceOrView",
    "BackendSelect", "Batched", "Vmap", "Tracer", "Named", "Conjugate", "Negative", "ZeroTensor",
    "Undefined", "PreDispatch", "Functional", "EndOf", "StartOf",
)


def check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    return value


def is_functionality_key(key: str) -> bool:
    """``Dense``, ``Sparse``, ``Quantized``...: a feature of many backends, never a kernel's own key."""
    return key == "Dense" or f"{key}CPU" in torch._C.DispatchKey.__members__


def check_dispatch_key(key: Any) -> str:
    """The key's name when an override may sit there; ``ValueError`` naming the rule otherwise."""
    if isinstance(key, torch._C.DispatchKey):
        key = key.name
    key = check_str(key, "dispatch_key")
    if key in NON_BACKEND_KEYS:
        raise ValueError(
            f"dispatch_key={key!r} is not allowed: overrides sit at backend keys (CPU, CUDA, XPU, ...) "
            "so that autograd and autocast keep aten's formulas above them"
        )
    known = torch._C.DispatchKey.__members__
    if key not in known:
        close = difflib.get_close_matches(key, list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"dispatch_key={key!r} is not a dispatch key{hint}")
    if key.startswith(NON_BACKEND_PREFIXES):
        raise ValueError(
            f"dispatch_key={key!r} is not a backend key: overrides sit at backend keys (CPU, CUDA, XPU, ...)"
        )
    if is_functionality_key(key):
        raise ValueError(
            f"dispatch_key={key!r} names a functionality shared by many backends, not a backend key; "
            f"use a backend key (CPU, CUDA, XPU, ...) or one of its forms (e.g. {key if key != 'Dense' else ''}CUDA)"
        )
    return key


@functools.cache
def accepted_dispatch_keys() -> frozenset[str]:
    """Keys an override can sit at, hence the only ones worth switching."""
    accepted = []
    for key in torch._C.DispatchKey.__members__:
        try:
            check_dispatch_key(key)
        except ValueError:
            continue
        accepted.append(key)
    return frozenset(accepted)


def accepted_summary() -> str:
    kinds = tuple(k for k in torch._C.DispatchKey.__members__ if is_functionality_key(k) and k != "Dense")
    accepted = accepted_dispatch_keys()
    dense = [k for k in torch._C.DispatchKey.__members__ if k in accepted and not k.startswith(kinds)]
    return (
        f"{', '.join(dense)}, and their {'/'.join(k for k in kinds if not k.startswith(NON_BACKEND_PREFIXES))} "
        "forms (e.g. SparseCUDA)"
    )


def check_switchable_keys(values: Iterable[Any], *, stacklevel: int = 2) -> tuple[str, ...]:
    """Keys a user switches (str or ``torch._C.DispatchKey``).

    A name no override can sit at (misspelt, empty, ``Meta``, ``AutogradCUDA``...) is warned about,
    naming close matches and the accepted keys, and kept: switching it does nothing, as in torch's
    own panel, so code written against that panel runs unchanged. Only a value that is no name at
    all (not a str) is refused.
    """
    names = []
    members = torch._C.DispatchKey.__members__
    for value in values:
        if isinstance(value, torch._C.DispatchKey):
            value = value.name
        if not isinstance(value, str):
            raise TypeError(f"dispatch keys must be str, got {type(value).__name__}: {value!r}")
        problem = _switch_problem(value, members)
        if problem is not None:
            warnings.warn(f"python_native: {problem}", UserWarning, stacklevel=stacklevel + 1)
        names.append(value)
    return tuple(names)


def unreachable_reason(key: str) -> str | None:
    """Why no call on this machine reaches an override at ``key`` (no device of its kind), or None."""
    if key.endswith("CUDA"):
        if not torch.backends.cuda.is_built():
            return "this torch build has no CUDA"
        if not torch.cuda.is_available():
            return "no CUDA device here"
    for device in ("XPU", "MPS"):
        if key.endswith(device):
            module = getattr(torch, device.lower(), None) if device == "XPU" else torch.backends.mps
            available = getattr(module, "is_available", None)
            if not (callable(available) and available()):
                return f"no {device} device here"
    return None


def _switch_problem(value: str, members: Any) -> str | None:
    if value not in members:
        close = [k for k in members if k.lower() == value.lower()]
        close = close or difflib.get_close_matches(value, list(members), n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return f"{value!r} is not a dispatch key, so switching it has no effect{hint}"
    if value not in accepted_dispatch_keys():
        why = (
            "a functionality shared by many backends"
            if is_functionality_key(value)
            else "not a backend key" if value not in NON_BACKEND_KEYS else "a key overrides are never installed at"
        )
        return (
            f"dispatch key {value!r} is {why}, so no override can fire there and switching it has no effect; "
            f"accepted keys: {accepted_summary()}"
        )
    return None
