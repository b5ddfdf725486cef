"""Turn Python numbers that arrived in Tensor parameters back into aten's wrapped-number tensors.

aten accepts ``x * 2`` by wrapping the 2 into a "wrapped number": a 0-dim CPU tensor of the
number's widest type (bool, int64, float64, complex128) flagged so that type promotion ranks it
below every real tensor. The dispatcher hands a Python kernel the plain number again, and the
captured kernel only takes tensors there. Python cannot set that flag, but a tensor that carries
it keeps it through ``detach()`` and ``set_()``: one real wrapped number per type is taken from
an autograd node on the meta device (where no override can sit) and each call gets a detached
copy of it pointing at the call's own value. The kernel then sees exactly what aten would have
passed it. Where a torch build does not keep the flag that way, a plain tensor chosen to promote
the same way is used instead.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

_WIDE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}
_SAMPLE = {bool: True, int: 3, float: 0.5, complex: 1j}

_prototypes: dict[type, torch.Tensor] | None = None
_lock = threading.Lock()


def _wrapped_prototype(kind: type) -> torch.Tensor | None:
    """A tensor aten itself wrapped from a ``kind`` number (taken from the autograd node of a meta mul)."""
    with torch.enable_grad(), torch.inference_mode(False):
        seed = torch.ones((), dtype=torch.complex64 if kind is complex else torch.float32, device="meta")
        node = (seed.requires_grad_() * _SAMPLE[kind]).grad_fn
        saved = getattr(node, "_saved_other", None)
    if not isinstance(saved, torch.Tensor) or saved.dtype != _WIDE[kind] or saved.dim() != 0:
        return None
    return saved


def _keeps_flag(proto: torch.Tensor) -> bool:
    """Whether a detached, re-pointed copy of the int prototype still promotes as a wrapped number."""
    copy = proto.detach()
    copy.set_(torch.tensor(300, dtype=torch.int64))
    # A 0-dim int8 tensor next to a wrapped int stays int8; next to a plain int64 tensor it widens.
    return torch.result_type(torch.zeros((), dtype=torch.int8), copy) == torch.int8


def _load_prototypes() -> dict[type, torch.Tensor]:
    global _prototypes
    with _lock:
        if _prototypes is None:
            found: dict[type, torch.Tensor] = {}
            try:
                for kind in _WIDE:
                    proto = _wrapped_prototype(kind)
                    if proto is not None:
                        found[kind] = proto
                if int not in found or not _keeps_flag(found[int]):
                    found = {}
            except Exception:
                found = {}
            _prototypes = found
        return _prototypes


def wrapped_number(value: Any) -> Any:
    """``value`` as aten's wrapped-number tensor; anything but a Python number is returned as is."""
    kind = type(value)
    wide = _WIDE.get(kind)
    if wide is None:
        return value  # a tensor, None, or something aten will reject with its own error
    number = torch.tensor(value, dtype=wide, device="cpu")
    protos = _prototypes if _prototypes is not None else _load_prototypes()
    proto = protos.get(kind)
    if proto is None:
        return number
    wrapped = proto.detach()
    wrapped.set_(number)
    return wrapped


def coerce(value: Any, peers: tuple) -> Any:
    """``value`` as a tensor aten's kernel treats like the wrapped number ``x * value`` would carry."""
    kind = type(value)
    if kind not in _WIDE:
        return value
    if _prototypes is None:
        _load_prototypes()
    if kind in _prototypes:
        return wrapped_number(value)
    return _promoting_like_wrapped(value, peers)


def _category(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 0 if dtype == torch.bool else 1


def _promoting_like_wrapped(value: Any, peers: tuple) -> torch.Tensor:
    """A plain tensor promoting like the wrapped number next to ``peers`` (reduced floats may round twice)."""
    kind = type(value)
    wide = _WIDE[kind]
    number = torch.tensor(value, dtype=wide, device="cpu")
    peer = next((p for p in peers if isinstance(p, torch.Tensor)), None)
    if peer is None:
        return number
    target = torch.result_type(peer, value)
    if peer.dim() > 0 and _CATEGORY[kind] <= _category(peer.dtype):
        return number  # neither a wrapped number nor a 0-dim tensor of its kind takes part
    if peer.dim() == 0 and torch.promote_types(peer.dtype, wide) == target:
        return number
    return number.to(target)


def _renew_lock_in_child() -> None:
    """A forked child must not inherit the lock another thread held at the fork."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)
