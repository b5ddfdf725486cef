"""``OverrideHandle``: one registered override, as users, ordering functions and features see it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Cond = Callable[..., Any]
Impl = Callable[..., Any]
OrderFn = Callable[[str, str, list["OverrideHandle"]], list["OverrideHandle"]]


class OverrideHandle:
    """One registered override. ``remove()`` takes it (and the forms derived from it) out.

    ``cond`` and ``impl`` are what was registered; ``routed_cond`` and ``routed_impl`` what the
    router calls after the features' wrappers (a calibration gate, checked mode) were applied.
    ``explain`` says why ``cond`` declines a call (asked only while a trace is open), or None.
    ``variants`` maps each declared variant's name to its impl (``"default"`` is ``impl``);
    ``variant`` names the one the router calls now (``"aten"``: none, the override is inactive).
    Derived in-place/``out=`` overrides share the functional override's variants and choice.
    """

    __slots__ = (
        "dsl", "lib", "op", "dispatch_key", "cond", "impl", "priority", "unconditional", "takes_plan",
        "uid", "name", "op_names", "epilogue", "derived_from", "derived", "routed_cond", "routed_impl",
        "explain", "variants", "variant", "_slot", "_registry", "_removed",
    )

    def __init__(self, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self, key, value)
        self.explain = fields.get("explain")
        self.derived: list[OverrideHandle] = []
        self.variants: dict[str, Impl] = {"default": self.impl}
        self.variant = "default"
        self.routed_cond = self.cond
        self.routed_impl = self.impl
        self._slot: Any = None  # the core's Slot (handles sit below slots, so untyped here)
        self._removed = False

    @classmethod
    def new(cls, uid: int, dsl: str, lib: str, sig: Any, key: str, cond: Cond | None, impl: Impl, unconditional: bool,
            priority: int, epilogue: str, takes_plan: bool, registry: Any) -> OverrideHandle:
        """A fresh handle for one piece (``epilogue``: functional, inplace or out) of a registration."""
        return cls(
            dsl=dsl, lib=lib, op=sig.qualified, dispatch_key=key, cond=cond, impl=impl,
            priority=priority, unconditional=unconditional or cond is None, takes_plan=takes_plan, uid=uid,
            name=f"{dsl}::{sig.qualified}#{uid}", op_names=tuple(dict.fromkeys((sig.qualified, sig.packet))),
            epilogue=epilogue, derived_from=None, _registry=registry,
        )

    # Names torch's in-tree registry uses, so user ordering functions written for it work here.
    @property
    def dsl_name(self) -> str:
        return self.dsl

    @property
    def op_symbol(self) -> str:
        return self.op

    @property
    def cond_fn(self) -> Cond | None:
        return self.cond

    @property
    def impl_fn(self) -> Impl:
        return self.impl

    @property
    def unconditional_override(self) -> bool:
        return self.unconditional

    @property
    def chosen_impl(self) -> Impl:
        """The impl of the chosen variant (the default one while ``"aten"`` is chosen)."""
        return self.variants.get(self.variant, self.impl)

    @property
    def functional(self) -> OverrideHandle:
        """The override this one was derived from (in-place/``out=`` forms), else itself."""
        return self.derived_from if self.derived_from is not None else self

    @property
    def slot(self) -> Any:
        """The slot this override routes in (None once removed)."""
        return None if self._removed else self._slot

    @property
    def removed(self) -> bool:
        return self._removed

    @property
    def active(self) -> bool:
        """Whether calls can reach this override now (not removed, nothing disables it)."""
        return not self._removed and self._registry.is_active(self)

    def remove(self) -> None:
        """Take this override out of its slot; removing twice is a no-op."""
        self._registry.remove(self)

    def __reduce_ex__(self, protocol: object) -> tuple:
        raise TypeError(
            f"cannot pickle {self.name}: an OverrideHandle is a live registration in this process's "
            "dispatcher; pickle the cond and impl it was registered with and register them again"
        )

    def __repr__(self) -> str:
        state = "removed" if self._removed else ("active" if self.active else "inactive")
        return f"<override {self.name} {self.lib}::{self.op} @ {self.dispatch_key}, {state}>"
