"""Plan-or-reason: one function per op says how the kernels take a call (a plan) or why they do not
(a reason: a ``str``). The op's cond and its explain are both read off it, so the two never
disagree, and the result is cached per layout (sizes, strides, dtype and device of every tensor
argument, and the other arguments' values), so a call pays for its checks once per layout.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import torch

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.spec import OverrideSpec

P = TypeVar("P")
_Tensor = torch.Tensor
NAMESPACE = "python_native"


def _layout_key(args: tuple) -> tuple | None:
    """What a plan depends on, per argument; None where a tensor is not a plain ``torch.Tensor``
    (a FakeTensor's sizes may be symbolic: such calls are planned afresh)."""
    key: list[Hashable] = []
    for a in args:
        if a.__class__ is _Tensor:
            key.append((a.size(), a.stride(), a.dtype, a.is_cuda, a.is_cpu))
        elif isinstance(a, _Tensor):
            return None
        else:
            key.append(a)
    return tuple(key)


class PlanOrReason(Generic[P]):
    """``build(*args) -> plan | reason``, cached per layout; ``cond`` and ``explain`` for the op's spec."""

    def __init__(self, build: Callable[..., P | str]) -> None:
        self._build = build
        self._cache: SpecializationCache[P | str] = SpecializationCache(build, 4096)
        self._lookup = self._cache.lookup

    def __call__(self, *args: Any) -> P | str:
        key = _layout_key(args)
        if key is None:
            return self._build(*args)
        found = self._lookup(key, MISSING)
        return self._cache.get(key, *args) if found is MISSING else found

    def cond(self, *args: Any) -> P | None:
        """The plan (handed to the impl as ``plan``), or None: declined."""
        found = self(*args)
        return None if found.__class__ is str else found

    def explain(self, *args: Any) -> str | None:
        """Why the cond declined (traced calls ask)."""
        found = self(*args)
        return found if found.__class__ is str else None

    def require(self, *args: Any) -> P:
        """The plan for an impl called without its cond; ``ValueError`` with the reason where there is none."""
        found = self(*args)
        if found.__class__ is str:
            raise ValueError(f"the Triton kernels cannot take this call: {found}")
        return found


def declared_spec(op: str, plans: PlanOrReason, impl: Callable[..., Any], public_name: str,
                  backward: bool = False) -> OverrideSpec:
    """The override of ``python_native::<op>``: planned (the impl takes the cond's plan), unmeasured
    until a GPU has timed it against the op's reference."""
    return OverrideSpec(op, plans.cond, impl, {"impl_takes_plan": True}, measured=False, lib=NAMESPACE,
                        public_name=public_name, backward=backward, explain=plans.explain)
