"""User-facing switches: per-DSL controllers and the disable/enable scopes over names."""

from __future__ import annotations

import difflib
import functools
import numbers
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from python_native.core.registry import REGISTRY
from python_native.foundations import declared, dsl_registry, public_names, schema, uncompiled
from python_native.foundations.dispatch_keys import check_switchable_keys
from python_native.panel import bootstrap as _bootstrap

F = TypeVar("F", bound=Callable[..., Any])


class Scope:
    """A reference-counted disable: holds ``names`` of ``kind`` off from enter to exit.

    The same object may be entered again (even from another thread); each entry takes its own
    hold, and each exit releases the most recent hold it took, whether the body raised or not.
    Inside a function ``torch.compile`` runs, the block runs eagerly, outside any graph (see
    ``uncompiled``).
    """

    __slots__ = ("_kind", "_names", "_tokens")

    def __init__(self, kind: str, names: tuple[str, ...]):
        self._kind = kind
        self._names = names
        self._tokens: list[tuple[int, Any]] = []  # (registry hold, Dynamo pause) per entry

    @uncompiled.entering
    def __enter__(self) -> None:
        paused = uncompiled.pause()
        try:
            self._tokens.append((REGISTRY.hold(self._kind, self._names), paused))
        except BaseException:
            uncompiled.resume(paused)
            raise

    @uncompiled.entering
    def __exit__(self, *exc_info: object) -> None:
        try:
            token, paused = self._tokens.pop()
        except IndexError:
            raise RuntimeError(f"{self!r} was exited more times than it was entered") from None
        try:
            REGISTRY.release(self._kind, self._names, token)
        finally:
            uncompiled.resume(paused)

    def __reduce__(self) -> tuple:
        """A scope pickles as what it disables; the holds it has open stay with this process."""
        return (Scope, (self._kind, self._names))

    @uncompiled.opaque
    def __call__(self, fn: F) -> F:
        """Decorator use, like torch's flag scopes: ``fn`` runs with the names held off.

        Each call takes its own hold with a local token, so concurrent calls from several
        threads never release one another's holds. Called from compiled code, ``fn`` runs eagerly.
        """
        if not callable(fn):
            raise TypeError(f"a python_native scope decorates a callable, got {type(fn).__name__}: {fn!r}")
        kind, names = self._kind, self._names

        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            paused = uncompiled.pause()
            try:
                token = REGISTRY.hold(kind, names)
                try:
                    return fn(*args, **kwargs)
                finally:
                    REGISTRY.release(kind, names, token)
            finally:
                uncompiled.resume(paused)

        return uncompiled.entering(scoped)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<python_native scope disabling {self._kind} {list(self._names)}>"


_normalized: dict[tuple[Any, ...], tuple[int, tuple[str, ...]]] = {}


def op_names(values: tuple[Any, ...], what: str = "disable_operations") -> tuple[str, ...]:
    """The op names a switch holds for ``values``: each name, normalised (``"bmm.default"`` → ``"bmm"``),
    and the aten ops it covers (``"softmax"`` → ``_softmax``, ``_softmax_backward_data``; see
    ``public_names``). Warns about names no op has, with close matches.

    Scopes are entered in hot loops, so names found known once skip the checks (until a backend
    declares new public names); unknown ones are checked, and warned about, on every call.
    """
    try:
        generation, names = _normalized[values]
        if generation == public_names.generation:
            return names
    except (KeyError, TypeError):
        pass
    generation = public_names.generation
    normalised, all_known = _normalise(values, what)
    names = tuple(dict.fromkeys(n for name in normalised for n in (name, *public_names.covered(name))))
    if all_known and len(_normalized) < 4096:
        try:
            _normalized[values] = (generation, names)
        except TypeError:  # unhashable values: not cached
            pass
    return names


def op_targets(value: Any, what: str = "is_operation_disabled") -> tuple[str, ...]:
    """The ops whose state decides whether ``value`` is disabled: those it covers, or itself."""
    (name,), _ = _normalise((value,), what)
    return public_names.covered(name) or (name,)


def op_is_off(name: str) -> bool:
    """Whether one op is off: by its own name, its bare name, or (for an in-place or ``out=``
    variant derived from another op's override) by the name of the op it derives from."""
    if REGISTRY.is_off("op", name) or REGISTRY.is_off("op", name.partition(".")[0]):
        return True
    return any(
        REGISTRY.is_off("op", parent_name)
        for o in REGISTRY.overrides()
        if o.derived_from is not None and name in (o.op, o.op.partition(".")[0])
        for parent_name in o.derived_from.op_names
    )


def _op_symbol(value: Any) -> str:
    """What a user may name an op by, as a symbol: ``"bmm"``, ``"aten::bmm"``, ``torch.ops.aten.bmm(.default)``,
    ``"python_native::linear_cross_entropy"``."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        value = value.name() if isinstance(value, torch._ops.OpOverload) else value._qualified_op_name
    if not isinstance(value, str):
        raise TypeError(
            f"op symbols must be str, torch.ops OpOverload or OpOverloadPacket, got {type(value).__name__}: {value!r}"
        )
    namespace, sep, rest = value.partition("::")
    if sep:
        allowed = _namespaces()
        if namespace not in allowed:
            raise ValueError(
                f"op {value!r} is in namespace {namespace!r}, where no override sits; "
                f"overrides here sit in {list(allowed)}"
            )
        value = rest
    return value


def _namespaces() -> tuple[str, ...]:
    """Where overrides may sit: aten, the package's own namespace (declared ops), and any other
    namespace an override was registered in. Switches name ops without their namespace."""
    return tuple(dict.fromkeys(("aten", declared.NAMESPACE, *(o.lib for o in REGISTRY.overrides()))))


def _normalise(values: tuple[Any, ...], what: str) -> tuple[tuple[str, ...], bool]:
    """Each value as an op name, and whether all of them are names some op has (the others warn)."""
    if not values:
        raise TypeError(
            f"{what}() needs at least one op name, e.g. {what}('softmax') or {what}(torch.ops.aten.bmm); "
            "pn.operation_names() lists the names of the installed overrides"
        )
    names = []
    all_known = True
    known = REGISTRY.known_op_names()
    for value in (_op_symbol(v) for v in values):
        if value in known or public_names.is_public(value):
            names.append(value)
            continue
        packet, overload = schema.split_symbol(value)
        name = schema.qualify(packet, overload)
        if name not in known and not public_names.covered(name) and not any(
            schema.op_exists(ns, name) for ns in _namespaces()
        ):
            all_known = False
            candidates = sorted(set(REGISTRY.known_op_names()) | set(public_names.groups()))
            close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
            close = close or schema.close_op_names("aten", name)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            # stacklevel: here, op_names or op_targets, the pn function, then the user's line.
            warnings.warn(f"python_native: no op is named {value!r}{hint}", UserWarning, stacklevel=4)
            all_known = False
        names.append(name)
    return tuple(names), all_known


_keys_checked: dict[tuple[Any, ...], tuple[str, ...]] = {}


def dispatch_key_names(values: tuple[Any, ...], what: str = "disable_dispatch_keys") -> tuple[str, ...]:
    """Check dispatch keys (str or ``torch._C.DispatchKey``); cached, since scopes are entered in hot loops."""
    try:
        return _keys_checked[values]
    except (KeyError, TypeError):
        pass
    if not values:
        raise TypeError(f"{what}() needs at least one dispatch key, e.g. {what}('CUDA')")
    names = check_switchable_keys(values, stacklevel=4)
    if len(_keys_checked) < 1024:
        _keys_checked[values] = names
    return names


def dsl_name(value: Any, warn_unknown: bool = False) -> str:
    """Check a DSL name's type; with ``warn_unknown``, warn about a name no DSL has, with close matches."""
    if not isinstance(value, str):
        raise TypeError(f"DSL names must be str, got {type(value).__name__}: {value!r}")
    if warn_unknown and not dsl_registry.is_known(value):
        names = dsl_registry.names()
        close = difflib.get_close_matches(value, names, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        warnings.warn(f"python_native: no DSL is named {value!r}; {hint}(DSLs: {names})", UserWarning, stacklevel=3)
    return value


def flag_value(value: Any, what: str) -> bool:
    """A flag the way torch's backend flags take them: bools, and the integers 0 and 1; not strings."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    if isinstance(value, numbers.Integral):
        if value in (0, 1):
            return bool(value)
        raise ValueError(f"{what} must be a bool (or 0/1), got {value!r}")
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
        _bootstrap.settle()
        return dsl_registry.available(self._name)

    @property
    def unavailable_reason(self) -> str | None:
        _bootstrap.settle()
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

    @uncompiled.opaque
    def enable(self) -> None:
        """Route to this DSL's overrides again (lifts scopes still open too)."""
        REGISTRY.enable("dsl", (self._name,))

    @uncompiled.opaque
    def disable(self) -> None:
        """Stop routing to this DSL's overrides until ``enable()``."""
        REGISTRY.disable("dsl", (self._name,))

    @uncompiled.opaque
    def disabled(self) -> Scope:
        """Context manager or decorator: this DSL's overrides are off inside the block or call."""
        return Scope("dsl", (self._name,))

    @property
    def operations(self) -> list[str]:
        _bootstrap.settle()
        return REGISTRY.dsl_operations(self._name)

    def __repr__(self) -> str:
        status = "available" if self.available else "unavailable"
        enabled = "enabled" if self.enabled else "disabled"
        return f"DSLController({self._name}, {status}, {enabled})"
