"""Opaque ``python_native::<op>`` twins of overridden aten ops, for compiled and exported graphs.

A twin has its aten op's schema. Under fake tensors it runs aten's meta kernel; for real it
calls the aten op through the dispatcher, so the override router decides at run time.

Twins take their aten op's name in the ``python_native`` namespace; ops the package declares there
(``python_native.foundations.custom_ops``) take names aten does not have, and are opaque in compiled graphs by
themselves. Should aten ever grow a custom op's name, that op gets no twin (``not_opaque`` says why).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from python_native.core.registry import REGISTRY
from python_native.foundations import custom_ops

NAMESPACE = custom_ops.NAMESPACE

_lock = threading.RLock()
_library: torch.library.Library | None = None
_opaque: dict[Any, Any] = {}  # aten OpOverload -> python_native OpOverload
_unsupported: dict[str, str] = {}  # aten qualified name -> why it cannot be made opaque
_RANDOMNESS_TAGS = (torch.Tag.nondeterministic_seeded, torch.Tag.nondeterministic_bitwise)


def _overridden_aten_ops() -> list[Any]:
    """aten overloads that have at least one registered override (active or not)."""
    found: dict[Any, None] = {}
    for handle in REGISTRY.overrides():
        if handle.lib != "aten":
            continue
        packet, _, overload = handle.op.partition(".")
        found[getattr(getattr(torch.ops.aten, packet), overload or "default")] = None
    return list(found)


def _schema_problem(schema: torch._C.FunctionSchema) -> str | None:
    if schema.is_mutable:
        return "it mutates an argument (compiled graphs hold its functional form)"
    for ret in schema.returns:
        if ret.alias_info is not None:
            return "it returns a view of an input"
        if not str(ret.type).startswith("Tensor"):
            return f"it returns {ret.type}, not tensors"
    if not schema.returns:
        return "it returns nothing"
    return None


def opaque_op(aten_op: Any) -> Any | None:
    """The ``python_native::`` twin of ``aten_op`` (defined on first use), or None if it has none."""
    global _library
    with _lock:
        if aten_op in _opaque:
            return _opaque[aten_op]
        schema = aten_op._schema
        name = aten_op.name().split("::", 1)[1]
        problem = _schema_problem(schema)
        if problem is None and custom_ops.is_custom_op(name.partition(".")[0]):
            problem = f"{NAMESPACE}::{name.partition('.')[0]} is an op the package declares"
        if problem is not None:
            _unsupported[name] = problem
            return None
        if _library is None:
            _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        try:
            # Random ops stay random: graph passes must not merge or reorder two calls of the twin.
            tags = tuple(t for t in aten_op.tags if t in _RANDOMNESS_TAGS)
            _library.define(str(schema).split("::", 1)[1], tags=tags)
            _library.impl(name, _forwarder(aten_op), "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", _forwarder(aten_op), lib=_library)
        except Exception as e:  # a registration must never fail because its op cannot be made opaque
            _unsupported[name] = f"defining {NAMESPACE}::{name} failed: {e}"
            return None
        packet, _, overload = name.partition(".")
        twin = getattr(getattr(getattr(torch.ops, NAMESPACE), packet), overload or "default")
        _opaque[aten_op] = twin
        return twin


def _forwarder(aten_op: Any) -> Callable[..., Any]:
    """Calls ``aten_op`` through the dispatcher: the router at run time, aten's meta under fake tensors."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return aten_op(*args, **kwargs)

    forward.__name__ = f"call_{aten_op.name().replace('::', '_').replace('.', '_')}"
    return forward


def opaque_table() -> dict[Any, Any]:
    """Each aten overload with an override -> its opaque twin (overloads that have none are left out)."""
    table: dict[Any, Any] = {}
    for aten_op in _overridden_aten_ops():
        twin = opaque_op(aten_op)
        if twin is not None:
            table[aten_op] = twin
    return table


def decomposition_table(base: Any = None) -> Any:
    """A table for ``ExportedProgram.run_decompositions`` that turns overridden ops opaque.

    ``base`` defaults to torch's own export table (core ATen), which also decomposes the
    composite ops (``softmax.int``, ``layer_norm``) that a plain table would leave whole, so
    they reach the overridden ops below them. Pass ``{}`` for the opaque entries alone.
    """
    if base is None:
        default = getattr(torch.export, "default_decompositions", None)
        base = default() if default is not None else {}
    for aten_op, twin in opaque_table().items():
        base[aten_op] = twin
    return base


def describe() -> dict[str, Any]:
    with _lock:
        return {
            "opaque_ops": sorted(twin.name() for twin in _opaque.values()),
            "not_opaque": dict(sorted(_unsupported.items())),
        }
