"""The cond of a declared op, generated once from its layout key: one fast path for every family.

A planned override's cond answers, per call, "has a call of this layout been planned before?":
for exact ``torch.Tensor`` arguments it builds a tuple from what the plan depends on (each tensor's
``size()``, ``stride()``, dtype and device flags, plus the scalars and expressions the op names)
and looks it up in a ``SpecializationCache``, one C-level ``dict.get``; on a miss, the op's
``plan_or_why`` runs and its plan (None for a reason) is stored. Anything else (FakeTensors, tensor
subclasses, whose sizes may be symbolic) is planned directly. The source is generated per op with
the op's own signature, like the routers, so the fast path costs what a hand-written one did, and
exists once.

Two guards come before the lookup where an op declares them (``Guards``). An op whose kernels are
not deterministic declines while ``torch.use_deterministic_algorithms(True)`` is in force: its
cond starts with one C call reading that flag (none for the deterministic ops). And a scalar
argument aten would refuse to convert (an ``alpha`` beyond the dtype's range), or one the kernels
would round to float32 where aten keeps double, declines on a miss (its value is part of the key):
aten then runs, and raises its own error where it raises one.
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
from python_native_dsls import scalars

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
    scalar: bool = False  # a ``Scalar`` (or ``Scalar?``): aten converts it to a dtype, checked


def params_of(lib: str, op: str) -> tuple[Param, ...]:
    """``lib::op``'s parameters (raises ``ValueError`` naming the op where it does not exist)."""
    sig = schema.signature_of(lib, op)
    if not sig.explicit:
        raise ValueError(f"{lib}::{op} has a keyword-only parameter named like a Python keyword: no cond for it")
    arguments = schema.find_overload(lib, op)._schema.arguments
    return tuple(
        Param(p.schema_name if p.kwarg_only else p.name, p.kwarg_only, p.tensor,
              p.tensor and isinstance(a.type, torch.OptionalType), p.has_default, p.default,
              isinstance(a.type.getElementType() if isinstance(a.type, torch.OptionalType) else a.type,
                         torch.NumberType))
        for p, a in zip(sig.params, arguments, strict=True)
    )


FLOAT32 = "float32"  # a ``Guards.scalars`` target: the kernels round the value to float32


@dataclass(frozen=True)
class Guards:
    """What a cond checks before its plan: ``nondeterministic`` (why the kernels' results vary
    from run to run, None: they do not) unless ``deterministic_when`` (an expression over the
    parameters) holds, and ``scalars``: per scalar parameter, the tensor parameter whose dtype
    aten converts it to, or ``FLOAT32``."""

    nondeterministic: str | None = None
    deterministic_when: str | None = None
    scalars: tuple[tuple[str, str], ...] = ()


def _names_checked(item: str, params: Sequence[Param], names: Mapping[str, Any], what: str) -> None:
    """Raise ``ValueError`` where expression ``item`` is no expression or names something unknown."""
    by_name = [p.name for p in params]
    try:
        tree = ast.parse(item, f"<{what}>", "eval")
    except SyntaxError as e:
        raise ValueError(f"{what} {item!r}: not an expression ({e.msg})") from None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    unknown = sorted(n for n in used if n not in by_name and n not in names and not hasattr(builtins, n))
    if unknown:
        raise ValueError(f"{what} {item!r} names {', '.join(unknown)}: neither a parameter "
                         f"({', '.join(by_name)}) nor a name given to the family")


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
        _names_checked(item, params, names, "layout key")
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


def _guard_source(guards: Guards, call: str, header: str) -> list[str]:
    """``_pn_refuse`` (the reason a scalar argument gives, else None) and ``_pn_why`` (that, or why
    deterministic mode declines): what the cond checks before its plan, in words, for explanations."""
    checks = [f"_pn_float32({name!r}, {name})" if target == FLOAT32 else f"_pn_overflow({name!r}, {name}, {target})"
              for name, target in guards.scalars]
    lines = [f"def _pn_refuse({header}):", f"    return {' or '.join(f'({c})' for c in checks) or 'None'}", ""]
    if guards.deterministic_when is not None:
        lines += [f"def _pn_undetermined({header}):", f"    return not ({guards.deterministic_when})", ""]
    lines += [f"def _pn_why({header}):"]
    if guards.nondeterministic is not None:
        lines.append(f"    if {_nondeterministic_test(guards, call)}:")
        lines.append("        return _pn_NONDETERMINISTIC")
    lines += [f"    return _pn_refuse({call})", ""]
    return lines


def _nondeterministic_test(guards: Guards, call: str) -> str:
    """The condition under which the kernels must decline for determinism: one C call, then the
    op's own expression only while deterministic algorithms are on."""
    if guards.deterministic_when is None:
        return "_pn_deterministic()"
    return f"_pn_deterministic() and _pn_undetermined({call})"


def source(name: str, params: Sequence[Param], key: Sequence[str], names: Mapping[str, Any], checked: bool,
           guards: Guards = Guards()) -> str:
    """The source of ``_pn_build`` (the plan or None, uncached), of the cond ``name`` and of its
    guards (``_pn_refuse``, ``_pn_why``)."""
    key_tuple, exact = key_source(params, key, names)
    header, call = _signature(params)
    flat = ", ".join(p.name for p in params)  # what the cache hands ``_pn_build``: positional only
    by_name = {p.name: p for p in params}
    tests = " and ".join(f"({t} is None or {t}.__class__ is _pn_Tensor)" if by_name[t].optional
                         else f"{t}.__class__ is _pn_Tensor" for t in exact)
    refuse = [f"    if _pn_refuse({call}) is not None:", "        return None"] if guards.scalars else []
    lines = [
        *_guard_source(guards, call, header),
        f"def _pn_build({flat}):",
        *refuse,
        f"    _pn_r = _pn_plan_or_why({call})",
        "    return None if _pn_r.__class__ is str else _pn_r",
        "",
        f"def {name}({header}):",
    ]
    if guards.nondeterministic is not None:
        lines += [f"    if {_nondeterministic_test(guards, call)}:", "        return None"]
    lines += [
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


def _guarded(params: Sequence[Param], key: Sequence[str], names: Mapping[str, Any], guards: Guards
             ) -> tuple[tuple[str, ...], Guards]:
    """``(key, guards)`` checked: every Scalar parameter converted (to the first tensor's dtype
    unless ``guards`` says otherwise), and every guarded scalar part of the key."""
    by_name = {p.name: p for p in params}
    targets = dict(guards.scalars)
    for name, target in targets.items():
        if name not in by_name or by_name[name].tensor:
            raise ValueError(f"scalars: {name!r} is not a scalar parameter ({', '.join(by_name)})")
        if target != FLOAT32 and not (target in by_name and by_name[target].tensor):
            raise ValueError(f"scalars: {name!r} converts to {target!r}, neither a tensor parameter nor {FLOAT32!r}")
    first = next((p.name for p in params if p.tensor), None)
    for p in params:
        if p.scalar and p.name not in targets and first is not None:
            targets[p.name] = first
    if guards.deterministic_when is not None:
        _names_checked(guards.deterministic_when, params, names, "deterministic_when")
    missing = tuple(n for n in targets if n not in key)
    return (*key, *missing), Guards(guards.nondeterministic, guards.deterministic_when, tuple(targets.items()))


def make_cond(
    name: str, params: Sequence[Param], key: Sequence[str], plan_or_why: Callable[..., Any],
    check: Callable[..., str | None] | None = None, names: Mapping[str, Any] | None = None,
    guards: Guards = Guards(),
) -> tuple[Callable[..., Any], SpecializationCache]:
    """``(cond, its plan cache)``: the cond returns the call's plan, or None where ``plan_or_why``
    gives a reason (or ``check(plan, *args)`` does, per call, for what no key can hold, or a
    guard: deterministic mode, a scalar argument). ``cond.refusal`` says in words why the guards
    decline a call (None where they do not)."""
    names = dict(names or {})
    key, guards = _guarded(params, key, names, guards)
    namespace: dict[str, Any] = {
        **names, "_pn_Tensor": torch.Tensor, "_pn_MISSING": MISSING, "_pn_plan_or_why": plan_or_why,
        "_pn_check": check, "_pn_deterministic": torch._C._get_deterministic_algorithms,
        "_pn_overflow": scalars.converted_why, "_pn_float32": scalars.float32_why,
        "_pn_NONDETERMINISTIC": f"deterministic algorithms are on: {guards.nondeterministic}",
    }
    text = source(name, params, key, names, check is not None, guards)
    exec(compile(text, f"<cond of {name}>", "exec"), namespace)  # noqa: S102 - our own generated source
    cache: SpecializationCache = SpecializationCache(namespace["_pn_build"], MAX_PLANS)
    namespace["_pn_lookup"], namespace["_pn_get"] = cache.lookup, cache.get
    cond = namespace[name]
    if not isinstance(cond, types.FunctionType):  # pragma: no cover - the source defines it
        raise AssertionError(f"generated source defines no {name}")
    refusal = namespace["_pn_why"]
    for fn in (cond, refusal):
        _defaults(fn, params)
        fn.__module__ = getattr(plan_or_why, "__module__", __name__)
    cond.source = text  # type: ignore[attr-defined]
    cond.refusal = refusal  # type: ignore[attr-defined]
    return cond, cache


def _defaults(fn: types.FunctionType, params: Sequence[Param]) -> None:
    """Give the generated ``fn`` the op's own defaults, so it takes a call as the op does."""
    positional = [p for p in params if not p.kwarg_only]
    first = next((i for i, p in enumerate(positional) if p.has_default), len(positional))
    if all(p.has_default for p in positional[first:]) and first < len(positional):
        fn.__defaults__ = tuple(p.default for p in positional[first:])
    fn.__kwdefaults__ = {p.name: p.default for p in params if p.kwarg_only and p.has_default} or None
