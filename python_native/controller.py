"""User-facing switches: per-DSL controllers and the disable/enable scopes over names."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from python_native import dsl_registry, schema
from python_native.registry import REGISTRY


class Scope:
    """A reference-counted disable: holds ``names`` of ``kind`` off from enter to exit.

    The same object may be entered again (even from another thread); each entry takes its own
    hold, and each exit releases the most recent hold it took, whether the body raised or not.
    """

    __slots__ = ("_kind", "_names", "_tokens")

    def __init__(self, kind: str, names: tuple[str, ...]):
        self._kind = kind
        self._names = names
        self._tokens: list[int] = []

    def __enter__(self) -> None:
        self._tokens.append(REGISTRY.hold(self._kind, self._names))

    def __exit__(self, *exc_info: object) -> None:
        REGISTRY.release(self._kind, self._names, self._tokens.pop())

    def __repr__(self) -> str:
        return f"<python_native scope disabling {self._kind} {list(self._names)}>"


def _strings(values: Iterable[Any], what: str) -> tuple[str, ...]:
    out = []
    for value in values:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be str, got {type(value).__name__}: {value!r}")
        out.append(value)
    return tuple(out)


_normalized: dict[tuple[str, ...], tuple[str, ...]] = {}


def op_names(values: tuple[Any, ...]) -> tuple[str, ...]:
    """Normalise op symbols (``"bmm.default"`` → ``"bmm"``); warn about names no op has.

    Scopes are entered in hot loops, so names already checked once skip the checks.
    """
    try:
        return _normalized[values]
    except (KeyError, TypeError):
        pass
    names = _check_op_names(values)
    if len(_normalized) < 4096:
        _normalized[values] = names
    return names


def _check_op_names(values: Iterable[Any]) -> tuple[str, ...]:
    names = []
    known = REGISTRY.known_op_names()
    for value in _strings(values, "op symbols"):
        if value in known:
            names.append(value)
            continue
        packet, overload = schema.split_symbol(value)
        name = schema.qualify(packet, overload)
        if name not in known and not any(
            schema.op_exists(ns, name) for ns in schema.OVERRIDABLE_NAMESPACES
        ):
            close = difflib.get_close_matches(name, sorted(REGISTRY.known_op_names()), n=3, cutoff=0.6)
            close = close or schema.close_op_names("aten", name)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            warnings.warn(f"python_native: no op is named {value!r}{hint}", UserWarning, stacklevel=4)
        names.append(name)
    return tuple(names)


def dispatch_key_names(values: Iterable[Any]) -> tuple[str, ...]:
    names = []
    for value in values:
        if isinstance(value, torch._C.DispatchKey):
            value = value.name
        if not isinstance(value, str):
            raise TypeError(f"dispatch keys must be str, got {type(value).__name__}: {value!r}")
        if value not in torch._C.DispatchKey.__members__:
            close = difflib.get_close_matches(value, list(torch._C.DispatchKey.__members__), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{value!r} is not a dispatch key{hint}")
        names.append(value)
    return tuple(names)


class DSLController:
    """The switch panel of one DSL: ``pn.triton``. One instance per DSL name."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def available(self) -> bool:
        """Whether the DSL's runtime can run kernels on this machine."""
        return dsl_registry.available(self._name)

    @property
    def unavailable_reason(self) -> str | None:
        return dsl_registry.unavailable_reason(self._name)

    @property
    def version(self):
        """The runtime's ``packaging.version.Version``, or None when it is not installed."""
        return dsl_registry.version(self._name)

    @property
    def enabled(self) -> bool:
        return not REGISTRY.is_off("dsl", self._name)

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if torch.backends.flags_frozen():
            raise RuntimeError(
                f"not allowed to set pn.{self._name}.enabled after torch.backends.disable_global_flags(); "
                f"use `with pn.{self._name}.disabled():` instead"
            )
        if not isinstance(value, bool):
            raise TypeError(f"pn.{self._name}.enabled must be a bool, got {type(value).__name__}: {value!r}")
        self.enable() if value else self.disable()

    def enable(self) -> None:
        """Route to this DSL's overrides again (lifts scopes still open too)."""
        REGISTRY.enable("dsl", (self._name,))

    def disable(self) -> None:
        """Stop routing to this DSL's overrides until ``enable()``."""
        REGISTRY.disable("dsl", (self._name,))

    def disabled(self) -> Scope:
        """Context manager: this DSL's overrides are off inside the block."""
        return Scope("dsl", (self._name,))

    @property
    def operations(self) -> list[str]:
        return REGISTRY.dsl_operations(self._name)

    def __repr__(self) -> str:
        status = "available" if self.available else "unavailable"
        enabled = "enabled" if self.enabled else "disabled"
        return f"DSLController({self._name}, {status}, {enabled})"
