"""User-facing switches: per-DSL controllers and the disable/enable scopes over names."""

from __future__ import annotations

import difflib
import functools
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from python_native import dsl_registry, schema
from python_native.core.registry import REGISTRY
from python_native.dispatch_keys import check_switchable_keys

F = TypeVar("F", bound=Callable[..., Any])


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
        try:
            token = self._tokens.pop()
        except IndexError:
            raise RuntimeError(f"{self!r} was exited more times than it was entered") from None
        REGISTRY.release(self._kind, self._names, token)

    def __reduce__(self) -> tuple:
        """A scope pickles as what it disables; the holds it has open stay with this process."""
        return (Scope, (self._kind, self._names))

    def __call__(self, fn: F) -> F:
        """Decorator use, like torch's flag scopes: ``fn`` runs with the names held off.

        Each call takes its own hold with a local token, so concurrent calls from several
        threads never release one another's holds.
        """
        if not callable(fn):
            raise TypeError(f"a python_native scope decorates a callable, got {type(fn).__name__}: {fn!r}")
        kind, names = self._kind, self._names

        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            token = REGISTRY.hold(kind, names)
            try:
                return fn(*args, **kwargs)
            finally:
                REGISTRY.release(kind, names, token)

        return scoped  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<python_native scope disabling {self._kind} {list(self._names)}>"


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


def _op_symbol(value: Any) -> str:
    """What a user may name an op by, as a symbol: ``"bmm"``, ``"aten::bmm"``, ``torch.ops.aten.bmm(.default)``."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        value = value.name() if isinstance(value, torch._ops.OpOverload) else value._qualified_op_name
    if not isinstance(value, str):
        raise TypeError(
            f"op symbols must be str, torch.ops OpOverload or OpOverloadPacket, got {type(value).__name__}: {value!r}"
        )
    namespace, sep, rest = value.partition("::")
    if sep:
        if namespace not in schema.OVERRIDABLE_NAMESPACES:
            raise ValueError(
                f"op {value!r} is in namespace {namespace!r}; python_native overrides only "
                f"{list(schema.OVERRIDABLE_NAMESPACES)}"
            )
        value = rest
    return value


def _check_op_names(values: Iterable[Any]) -> tuple[str, ...]:
    names = []
    known = REGISTRY.known_op_names()
    for value in (_op_symbol(v) for v in values):
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


_keys_checked: dict[tuple[Any, ...], tuple[str, ...]] = {}


def dispatch_key_names(values: tuple[Any, ...]) -> tuple[str, ...]:
    """Check dispatch keys (str or ``torch._C.DispatchKey``); cached, since scopes are entered in hot loops."""
    try:
        return _keys_checked[values]
    except (KeyError, TypeError):
        pass
    names = check_switchable_keys(values, stacklevel=4)
    if len(_keys_checked) < 1024:
        _keys_checked[values] = names
    return names


def dsl_name(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"DSL names must be str, got {type(value).__name__}: {value!r}")
    return value


def flag_value(value: Any, what: str) -> bool:
    """A truthy flag the way torch's backend flags take them: bools and integers, not strings."""
    if isinstance(value, (bool, numbers.Integral)) or type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise TypeError(f"{what} must be a bool (or 0/1), got {type(value).__name__}: {value!r}")


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
        self.enable() if flag_value(value, f"pn.{self._name}.enabled") else self.disable()

    def enable(self) -> None:
        """Route to this DSL's overrides again (lifts scopes still open too)."""
        REGISTRY.enable("dsl", (self._name,))

    def disable(self) -> None:
        """Stop routing to this DSL's overrides until ``enable()``."""
        REGISTRY.disable("dsl", (self._name,))

    def disabled(self) -> Scope:
        """Context manager or decorator: this DSL's overrides are off inside the block or call."""
        return Scope("dsl", (self._name,))

    @property
    def operations(self) -> list[str]:
        return REGISTRY.dsl_operations(self._name)

    def __repr__(self) -> str:
        status = "available" if self.available else "unavailable"
        enabled = "enabled" if self.enabled else "disabled"
        return f"DSLController({self._name}, {status}, {enabled})"
