"""Calls of an op derived from its declaration, for tests that iterate the declarations instead of
keeping a table of calls per family: the arguments the first case of the op's verify driver
(``Op.verify``) passes the op when run through its public call.

Where this machine's torch composes the public call without reaching the op (``F.rms_norm`` on a
CPU build never reaches ``aten::_fused_rms_norm``), the public call's own arguments are bound to
the op's by parameter name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import python_native as pn
from python_native_dsls.family import Built, Family

Call = tuple[tuple[Any, ...], dict[str, Any]]


def first_forward(fam: Family) -> Built:
    """The family's first forward op that declares a verify driver; fails naming the family where none does."""
    found = next((b for b in fam if not b.op.backward and b.op.verify is not None), None)
    assert found is not None, f"family {fam.name!r} declares no forward op with a verify driver (Op.verify)"
    return found


class _Record(TorchDispatchMode):
    """Records the first call of op ``name`` (``lib::op.overload``) the block makes."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.call = name, None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self.call is None and func.name() in (self.name, f"{self.name}.default"):
            self.call = (tuple(args), dict(kwargs or {}))
        return func(*args, **(kwargs or {}))


class _Outer(TorchFunctionMode):
    """Records the torch functions the block calls (the outermost ones), with their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Callable, tuple, dict]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls.append((func, tuple(args), dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


def _schema(built: Built) -> Any:
    packet, _, overload = built.spec.op.partition(".")
    return getattr(getattr(getattr(torch.ops, built.op.lib), packet), overload or "default")._schema


def _complete(built: Built, args: tuple, kwargs: dict) -> Call:
    """The call with every argument the dispatcher left out at its default filled in, as the
    override receives it."""
    schema_args = _schema(built).arguments
    positional = [a for a in schema_args if not a.kwarg_only]
    args = args + tuple(a.default_value for a in positional[len(args):] if a.name not in kwargs)
    keywords = {a.name: a.default_value for a in schema_args if a.kwarg_only and a.has_default_value()}
    return args, {**keywords, **kwargs}


def _bound(built: Built, calls: list[tuple[Callable, tuple, dict]]) -> Call:
    """The arguments of the first torch function called that names every argument the op needs,
    by name, as the op's (in its schema's order)."""
    schema_args = _schema(built).arguments
    for func, args, kwargs in calls:
        try:
            named = inspect.signature(func).bind(*args, **kwargs)
        except (TypeError, ValueError):  # a builtin without a signature, or another call's arguments
            continue
        named.apply_defaults()
        if all(a.name in named.arguments or a.has_default_value() for a in schema_args):
            return tuple(named.arguments[a.name] for a in schema_args if a.name in named.arguments), {}
    raise AssertionError(f"{built.op.lib}::{built.spec.op}: its first verify sample neither reaches it here nor "
                         f"calls a function naming its arguments ({[c[0] for c in calls]})")


def captured_call(built: Built, device: str) -> Call:
    """``(args, kwargs)`` the op receives from its verify driver's first sample (float32, on ``device``)."""
    assert built.op.verify is not None, f"{built.op.lib}::{built.spec.op} declares no verify driver (Op.verify)"
    sample = next(iter(built.op.verify.cases(torch.float32, device)))
    name = f"{built.op.lib}::{built.spec.op}"
    with pn.triton.disabled(), pn.cutedsl.disabled(), _Record(name) as record, _Outer() as outer:
        sample.fn(*sample.inputs)
    if record.call is not None:
        return _complete(built, *record.call)
    return _complete(built, *_bound(built, outer.calls))
