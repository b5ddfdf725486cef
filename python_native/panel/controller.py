"""User-facing switches: per-DSL controllers and the checks of the names switches take."""

from __future__ import annotations

import difflib
import numbers
import warnings
from typing import Any

import torch
from packaging.version import Version

from python_native.core.registry import REGISTRY
from python_native.foundations import custom_ops, dsl_registry, public_names, schema, uncompiled
from python_native.foundations.dispatch_keys import check_switchable_keys
from python_native.foundations.switches import ALL
from python_native.panel import bootstrap as _bootstrap
from python_native.panel import callables
from python_native.panel.scopes import Scope

__all__ = ["DSLController", "RuntimeVersion", "Scope", "dispatch_key_names", "dsl_name", "flag_value", "op_names",
           "op_targets", "op_is_off", "refuse_if_frozen"]


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
    form derived from another op's override) by the name of the op it derives from."""
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
    elif callable(value) and not isinstance(value, str):
        value = callables.op_name_of(value, _is_op_name)
    if not isinstance(value, str):
        raise TypeError(f"cannot name an op by {type(value).__name__} {value!r}: {callables.ACCEPTED}")
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


def _is_op_name(name: str) -> bool:
    """Whether some op answers to ``name``: a public name, an overridden op, or an op of aten."""
    return public_names.is_public(name) or name in REGISTRY.known_op_names() or schema.op_exists("aten", name)


def _namespaces() -> tuple[str, ...]:
    """Where overrides may sit: aten, the package's own namespace (custom ops), and any other
    namespace an override was registered in. Switches name ops without their namespace."""
    return tuple(dict.fromkeys(("aten", custom_ops.NAMESPACE, *(o.lib for o in REGISTRY.overrides()))))


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


def installed_names(dsl: str | None) -> dict[str, list[str]]:
    """``pn.operation_names(dsl)``: each name the op switches accept, with the installed ops it covers."""
    installed = set(REGISTRY.dsl_operations(dsl_name(dsl, warn_unknown=True))) if dsl is not None else {
        o.op for o in REGISTRY.overrides() if o.derived_from is None
    }
    names: dict[str, list[str]] = {}
    for public, covered in public_names.groups().items():
        present = [op for op in covered if op in installed]
        if present:
            names[public] = present
    functional = {o.op: o.derived_from.op for o in REGISTRY.overrides() if o.derived_from is not None}
    named = {op for listed in names.values() for op in listed}
    for op in sorted(installed - named - functional.keys()):
        names[op] = [op]
    for op in sorted((installed - named) & functional.keys()):  # a derived form: under its functional op
        entry = next((listed for listed in names.values() if functional[op] in listed), None)
        if entry is None:
            names[op] = [op]
        else:
            entry.append(op)
    return dict(sorted(names.items()))


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


def refuse_if_frozen(attribute: str, scoped: str) -> None:
    """Like torch's backend flags: bare assignment is refused after
    ``torch.backends.disable_global_flags()``; the scoped form still works."""
    if torch.backends.flags_frozen():
        raise RuntimeError(f"not allowed to set {attribute} after torch.backends.disable_global_flags(); "
                           f"use `with {scoped}:` instead")


class RuntimeVersion(Version):
    """A DSL runtime's version; calling it returns it (``pn.triton.version()``, as ``cudnn.version()``)."""

    def __call__(self) -> RuntimeVersion:
        return self


class NotInstalled:
    """``pn.<dsl>.version`` of a runtime that is not installed: falsy, equal to None, and calling it
    returns None (``major``, ``minor`` and ``micro`` are None too)."""

    major = minor = micro = None

    def __call__(self) -> None:
        return None

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return other is None or isinstance(other, NotInstalled)

    def __hash__(self) -> int:
        return hash(None)

    def __repr__(self) -> str:
        return "NOT_INSTALLED"

    def __str__(self) -> str:
        return "None"


NOT_INSTALLED = NotInstalled()


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
        _bootstrap.apply_env_changes()
        return dsl_registry.available(self._name)

    @property
    def unavailable_reason(self) -> str | None:
        _bootstrap.apply_env_changes()
        return dsl_registry.unavailable_reason(self._name)

    def is_available(self) -> bool:
        """``available``, called as torch's backends are asked (``torch.backends.cudnn.is_available()``)."""
        return self.available

    @property
    def version(self) -> RuntimeVersion | NotInstalled:
        """The runtime's version: a ``packaging.version.Version`` that may also be called, as
        ``torch.backends.cudnn.version()`` is (``pn.triton.version()``); when the runtime is not
        installed, ``NOT_INSTALLED``, which is falsy, equals None, and returns None when called."""
        found = dsl_registry.version(self._name)
        return NOT_INSTALLED if found is None else RuntimeVersion(str(found))

    @property
    def enabled(self) -> bool:
        return not REGISTRY.is_off("dsl", self._name)

    @enabled.setter
    def enabled(self, value: bool) -> None:
        refuse_if_frozen(f"pn.{self._name}.enabled", f"pn.{self._name}.disabled()")
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

    @uncompiled.opaque
    def flags(self, enabled: bool = False) -> Scope:
        """Context manager or decorator, as ``torch.backends.cudnn.flags(enabled=...)``: this DSL's
        overrides are on (``enabled=True``) or off inside the block, whatever they are outside."""
        return Scope("dsl", (self._name,), not flag_value(enabled, f"pn.{self._name}.flags(enabled=...)"))

    @property
    def operations(self) -> list[str]:
        _bootstrap.apply_env_changes()
        return REGISTRY.dsl_operations(self._name)

    def __repr__(self) -> str:
        status = "available" if self.available else "unavailable"
        enabled = "enabled" if self.enabled else "disabled"
        return f"DSLController({self._name}, {status}, {enabled})"


def require_overload(lib_symbol: str, op_symbol: str) -> None:
    """A bare name (``"bmm"``) names the op's default overload; ``"add"`` has none in the dispatcher."""
    if not isinstance(op_symbol, str) or not isinstance(lib_symbol, str) or "." in op_symbol:
        return
    if not lib_symbol.isidentifier():
        return  # the registration's own checks name the bad namespace
    if not op_symbol.isidentifier() or torch._C._dispatch_has_kernel(f"{lib_symbol}::{op_symbol}"):
        return
    prefix = f"{lib_symbol}::{op_symbol}."
    overloads = sorted(n.partition("::")[2] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))
    if overloads:
        raise ValueError(
            f"{lib_symbol}::{op_symbol} has no default overload: name one of {', '.join(overloads[:8])}"
            f"{', ...' if len(overloads) > 8 else ''}"
        )


def flags_scope(enabled: bool | None, dsls: dict[str, bool]) -> Scope:
    """The scope of ``pn.flags(enabled=..., dsl=...)``: the master switch and each named DSL."""
    parts = [] if enabled is None else [("all", (ALL,), not flag_value(enabled, "pn.flags(enabled=...)"))]
    known = dsl_registry.names()
    for name, value in dsls.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TypeError(f"pn.flags() got {name}={value!r}, but no DSL is named {name!r}; {hint}"
                            f"(DSLs: {known}; flags takes enabled= and DSL=bool for each DSL)")
        parts.append(("dsl", (name,), not flag_value(value, f"pn.flags({name}=...)")))
    if not parts:
        raise TypeError(f"pn.flags() needs enabled=True/False or a DSL=True/False (DSLs: {known})")
    return Scope(parts=tuple(parts))
