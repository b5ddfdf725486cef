"""The cond of a declared op, generated once from its layout key: one fast path for every family.

A planned override's cond answers, per call, "has a call of this layout been planned before?":
for exact ``torch.Tensor`` arguments it builds a tuple from what the plan depends on (each tensor's
``size()``, ``stride()``, dtype and device flags, plus the scalars and expressions the op names)
and looks it up in a ``SpecializationCache``, one C-level ``dict.get``; on a miss, the op's
``plan_or_why`` runs and its plan (None for a reason) is stored. Anything else (FakeTensors, tensor
subclasses, whose sizes may be symbolic) is planned directly. The source is generated per op with
the op's own signature, like the routers, so the fast path costs what a hand-written one did, and
exists once.
"""

from __future__ import annotations

import ast
import builtins
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from python_native.foundations import schema
from python_native.foundations.speckey import MISSING, SpecializationCache

# Entries per op's plan cache (cleared when full, as every plan cache is).
MAX_PLANS = 4096


@dataclass(frozen=True)
class Param:
    """One parameter of the op as its cond takes it."""

    name: str
    kwarg_only: bool
    tensor: bool
    optional: bool  # ``Tensor?``: None or a tensor
    has_default: bool
    default: Any


def params_of(lib: str, op: str) -> tuple[Param, ...]:
    """``lib::op``'s parameters (raises ``ValueError`` naming the op where it does not exist)."""
    sig = schema.signature_of(lib, op)
    if not sig.explicit:
        raise ValueError(f"{lib}::{op} has a keyword-only parameter named like a Python keyword: no cond for it")
    arguments = schema.find_overload(lib, op)._schema.arguments
    return tuple(
        Param(p.schema_name if p.kwarg_only else p.name, p.kwarg_only, p.tensor,
              p.tensor and isinstance(a.type, torch.OptionalType), p.has_default, p.default)
        for p, a in zip(sig.params, arguments, strict=True)
    )


def _layout(t: str) -> str:
    return f"{t}.size(), {t}.stride(), {t}.dtype, {t}.is_cuda, {t}.is_cpu"


def key_source(params: Sequence[Param], key: Sequence[str], names: Mapping[str, Any]) -> tuple[str, list[str]]:
    """``(the key tuple's source, the tensors it needs exact)`` for ``key``: a tensor parameter
    stands for its layout (None or a layout where optional); anything else is an expression over
    the parameters and ``names``, checked here so that a typo fails at declaration, not per call."""
    by_name = {p.name: p for p in params}
    parts, exact = [], []
    for item in key:
        p = by_name.get(item)
        if p is not None and p.tensor:
            exact.append(item)
            parts.append(f"None if {item} is None else ({_layout(item)})" if p.optional else _layout(item))
            continue
        try:
            tree = ast.parse(item, "<layout key>", "eval")
        except SyntaxError as e:
            raise ValueError(f"layout key {item!r}: not an expression ({e.msg})") from None
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        unknown = sorted(n for n in used if n not in by_name and n not in names and not hasattr(builtins, n))
        if unknown:
            raise ValueError(f"layout key {item!r} names {', '.join(unknown)}: neither a parameter "
                             f"({', '.join(by_name)}) nor a name given to the family")
        parts.append(item)
    if not exact:
        raise ValueError(f"layout key {tuple(key)!r} names no tensor parameter: nothing to plan by")
    return ", ".join(parts) + ("," if len(parts) == 1 else ""), exact


def _signature(params: Sequence[Param]) -> tuple[str, str]:
    """``(the def's parameter list, the call's argument list)`` in the op's own form."""
    positional = [p.name for p in params if not p.kwarg_only]
    keywords = [p.name for p in params if p.kwarg_only]
    header = ", ".join(positional + (["*"] + keywords if keywords else []))
    call = ", ".join(positional + [f"{k}={k}" for k in keywords])
    return header, call


def source(name: str, params: Sequence[Param], key: Sequence[str], names: Mapping[str, Any], checked: bool) -> str:
    """The source of ``_pn_build`` (the plan or None, uncached) and of the cond ``name``."""
    key_tuple, exact = key_source(params, key, names)
    header, call = _signature(params)
    flat = ", ".join(p.name for p in params)  # what the cache hands ``_pn_build``: positional only
    by_name = {p.name: p for p in params}
    tests = " and ".join(f"({t} is None or {t}.__class__ is _pn_Tensor)" if by_name[t].optional
                         else f"{t}.__class__ is _pn_Tensor" for t in exact)
    lines = [
        f"def _pn_build({flat}):",
        f"    _pn_r = _pn_plan_or_why({call})",
        "    return None if _pn_r.__class__ is str else _pn_r",
        "",
        f"def {name}({header}):",
        f"    if {tests}:",
        f"        _pn_k = ({key_tuple})",
        "        _pn_p = _pn_lookup(_pn_k, _pn_MISSING)",
        "        if _pn_p is _pn_MISSING:",
        f"            _pn_p = _pn_get(_pn_k, {flat})",
    ]
    if not checked:
        return "\n".join([*lines, "        return _pn_p", f"    return _pn_build({flat})", ""])
    return "\n".join([
        *lines,
        "    else:",
        f"        _pn_p = _pn_build({flat})",
        f"    if _pn_p is not None and _pn_check(_pn_p, {call}) is not None:",
        "        return None",
        "    return _pn_p",
        "",
    ])


def make_cond(
    name: str, params: Sequence[Param], key: Sequence[str], plan_or_why: Callable[..., Any],
    check: Callable[..., str | None] | None = None, names: Mapping[str, Any] | None = None,
) -> tuple[Callable[..., Any], SpecializationCache]:
    """``(cond, its plan cache)``: the cond returns the call's plan, or None where ``plan_or_why``
    gives a reason (or ``check(plan, *args)`` does, per call, for what no key can hold)."""
    names = dict(names or {})
    namespace: dict[str, Any] = {**names, "_pn_Tensor": torch.Tensor, "_pn_MISSING": MISSING,
                                 "_pn_plan_or_why": plan_or_why, "_pn_check": check}
    text = source(name, params, key, names, check is not None)
    exec(compile(text, f"<cond of {name}>", "exec"), namespace)  # noqa: S102 - our own generated source
    cache: SpecializationCache = SpecializationCache(namespace["_pn_build"], MAX_PLANS)
    namespace["_pn_lookup"], namespace["_pn_get"] = cache.lookup, cache.get
    cond = namespace[name]
    if not isinstance(cond, types.FunctionType):  # pragma: no cover - the source defines it
        raise AssertionError(f"generated source defines no {name}")
    positional = [p for p in params if not p.kwarg_only]
    first = next((i for i, p in enumerate(positional) if p.has_default), len(positional))
    if all(p.has_default for p in positional[first:]) and first < len(positional):
        cond.__defaults__ = tuple(p.default for p in positional[first:])
    cond.__kwdefaults__ = {p.name: p.default for p in params if p.kwarg_only and p.has_default} or None
    cond.__module__ = getattr(plan_or_why, "__module__", __name__)
    cond.source = text  # type: ignore[attr-defined]
    return cond, cache
