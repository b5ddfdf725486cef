"""Specialization keys: what a compiled kernel specialization depends on, built cheaply per call.

Kernels that compile per shape, dtype or stride look their specialization up with ``key(*args)``.
Exact ``torch.Tensor`` arguments take the fast path (the ``size()`` and ``stride()`` tuples
themselves, no per-dimension Python loop). Tensor subclasses and FakeTensors take a safe path
that turns symbolic sizes into their concrete hints, so a FakeTensor and a real tensor of the same
shape get equal keys.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")

_Tensor = torch.Tensor
# What ``SpecializationCache.lookup`` is given as its default: no entry yet (None is a valid entry).
MISSING: Any = object()


def _concrete(value: Any) -> Hashable:
    if isinstance(value, int):
        return int(value)
    if isinstance(value, torch.SymInt):
        hint = value.node.maybe_as_int()
        if hint is None and getattr(value.node, "hint", None) is not None:
            hint = value.node.hint
        return int(hint) if hint is not None else ("sym", str(value))
    return value


def tensor_key(t: torch.Tensor) -> tuple:
    """``(dtype, device, sizes, strides)`` of ``t``; symbolic sizes become their concrete hints.

    ``torch.Size`` is a tuple, so the plain tuples built here for subclasses and FakeTensors
    compare and hash equal to a real tensor's ``size()`` and ``stride()``.
    """
    if type(t) is _Tensor:
        return (t.dtype, t.device, t.size(), t.stride())
    return (t.dtype, t.device, tuple(_concrete(s) for s in t.size()), tuple(_concrete(s) for s in t.stride()))


def key(*args: Any) -> tuple:
    """A hashable key over ``args``: tensors by layout, sequences by element, others as they are."""
    return tuple(_arg_key(a) for a in args)


def _arg_key(a: Any) -> Hashable:
    if isinstance(a, torch.Tensor):
        return tensor_key(a)
    if isinstance(a, (list, tuple)):
        return tuple(_arg_key(x) for x in a)
    if isinstance(a, torch.SymInt):
        return _concrete(a)
    return a


class SpecializationCache(Generic[T]):
    """Compiled specializations by key; building a missing one happens once per key."""

    def __init__(self, build: Callable[..., T], max_entries: int = 1024):
        self._build = build
        self._entries: dict[Hashable, T] = {}
        # ``lookup(k, MISSING)``: the entries' own ``dict.get``, one C call where ``get`` is a Python
        # frame, for per-call paths; on ``MISSING`` they call ``get``, which builds. The dict is only
        # ever cleared in place, so the bound method stays valid.
        self.lookup: Callable[[Hashable, Any], Any] = self._entries.get
        self._lock = threading.Lock()
        self._max = max_entries
        _caches.add(self)

    def get(self, k: Hashable, *build_args: Any) -> T:
        """The specialization for key ``k``, built with ``build(*build_args)`` on first use."""
        try:
            return self._entries[k]
        except KeyError:
            pass
        with self._lock:
            if k not in self._entries:
                if len(self._entries) >= self._max:
                    self._entries.clear()
                self._entries[k] = self._build(*build_args)
            return self._entries[k]

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every specialization (they are built again on next use)."""
        with self._lock:
            self._entries.clear()


_caches: weakref.WeakSet[SpecializationCache] = weakref.WeakSet()


def _renew_locks_in_child() -> None:
    """A forked child must not inherit a build lock another thread held at the fork."""
    for cache in list(_caches):
        cache._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_in_child)
