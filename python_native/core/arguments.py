"""Checks of a registration's arguments, all made before anything in the dispatcher changes."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from python_native.foundations import codegen, dsl_registry, epilogues, schema
from python_native.foundations.dispatch_keys import check_dispatch_key, check_str

_renamed_warned = False  # the deprecated ``derive_variants`` warns once per process


def check_pieces(dsl: Any, lib_symbol: Any, op_symbol: Any, dispatch_key: Any, cond: Any, impl: Any, *,
                 unconditional: bool, priority: Any, takes_plan: Any) -> tuple[str, str, str, str]:
    """The registration's names, checked; ``TypeError``/``ValueError`` naming the bad value otherwise."""
    dsl = check_str(dsl, "dsl")
    lib_symbol = check_str(lib_symbol, "lib_symbol")
    op_symbol = check_str(op_symbol, "op_symbol")
    dispatch_key = check_dispatch_key(dispatch_key)
    if cond is None and not unconditional:
        raise ValueError("cond=None needs unconditional_override=True (an override with no cond always runs)")
    if cond is not None and not callable(cond):
        raise TypeError(f"cond must be callable or None, got {type(cond).__name__}: {cond!r}")
    if not callable(impl):
        raise TypeError(f"impl must be callable, got {type(impl).__name__}: {impl!r}")
    if not isinstance(takes_plan, bool):
        raise TypeError(f"impl_takes_plan must be a bool, got {type(takes_plan).__name__}: {takes_plan!r}")
    if takes_plan and cond is None:
        raise ValueError("impl_takes_plan=True needs a cond: the plan the impl receives is what the cond returned")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}: {priority!r}")
    if not dsl_registry.is_known(dsl):
        raise ValueError(f"unknown DSL {dsl!r}; registered DSLs: {dsl_registry.names()} (see pn.register_dsl)")
    # Any namespace will do: what makes an op overridable is that it exists (``signature``) and has a
    # kernel at the key to fall back to (``slots.current_kernel``), aten's or a custom op's own.
    if not lib_symbol.isidentifier():
        raise ValueError(f"lib_symbol={lib_symbol!r} is not an operator namespace (e.g. 'aten', 'python_native')")
    return dsl, lib_symbol, op_symbol, dispatch_key


def signature(lib_symbol: str, op_symbol: str, takes_plan: bool) -> schema.OpSignature:
    """The op's signature; ``ValueError`` (with close names) when it does not exist."""
    if schema.find_overload(lib_symbol, op_symbol) is None:
        close = schema.close_op_names(lib_symbol, op_symbol)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"op {lib_symbol}::{op_symbol} does not exist{hint}")
    sig = schema.signature_of(lib_symbol, op_symbol)
    if takes_plan and any(p.name == codegen.PLAN_KEYWORD for p in sig.params):
        raise ValueError(
            f"impl_takes_plan=True cannot be used for {lib_symbol}::{sig.qualified}: it has a parameter named "
            f"{codegen.PLAN_KEYWORD!r}, the keyword the plan is passed as"
        )
    return sig


def check_autograd_unchanged(lib_symbol: str, sig: schema.OpSignature, dispatch_key: str) -> None:
    """Refuse a kernel that would take autograd off a composite op's decomposition."""
    if not schema.autograd_would_change(lib_symbol, sig.qualified, dispatch_key):
        return
    parts = schema.decomposition_ops(lib_symbol, sig.qualified)
    instead = f"override the ops it decomposes into ({', '.join(parts)})" if parts else (
        "override the ops it decomposes into"
    )
    raise ValueError(
        f"{lib_symbol}::{sig.qualified} decomposes above autograd (CompositeImplicitAutograd) and has no "
        f"kernel of its own at {dispatch_key}: a kernel there would take "
        f"{schema.autograd_key_of(dispatch_key)} off that decomposition (to the op's own derivative, whose "
        f"backward kernel {dispatch_key} may lack, or to no gradient at all); {instead} instead"
    )


def derive_forms_option(derive_forms: Any, renamed: Mapping[str, Any]) -> Any:
    """What ``derive_forms`` asks for, taking the old name ``derive_variants`` (in ``renamed``) too.

    ``derive_variants`` named the same thing before *variant* came to mean an override's
    alternative impls only; it still works, with one ``DeprecationWarning`` per process.
    """
    global _renamed_warned
    unknown = [name for name in renamed if name != "derive_variants"]
    if unknown:
        raise TypeError(f"register_op_override() got an unexpected keyword argument {unknown[0]!r}")
    if not renamed:
        return False if derive_forms is None else derive_forms
    if derive_forms is not None:
        raise TypeError("derive_variants is the old name of derive_forms: pass derive_forms alone, not both")
    if not _renamed_warned:
        _renamed_warned = True
        warnings.warn("derive_variants is deprecated: pass derive_forms (same values)", DeprecationWarning,
                      stacklevel=4)
    return renamed["derive_variants"]


def derived_forms(lib_symbol: str, sig: schema.OpSignature, derive: bool | Iterable[str]) -> list[tuple[str, str]]:
    """``[(kind, op symbol)]`` of the in-place / ``out=`` forms ``derive_forms`` asks for."""
    if derive is False:
        return []
    if derive is True:
        kinds, required = epilogues.FORMS, False
    else:
        if isinstance(derive, str) or not isinstance(derive, Iterable):
            raise TypeError(f"derive_forms must be a bool or an iterable of {epilogues.FORMS}, got {derive!r}")
        kinds, required = tuple(derive), True
        bad = [k for k in kinds if k not in epilogues.FORMS]
        if bad:
            raise ValueError(f"derive_forms: unknown form(s) {bad}; allowed: {list(epilogues.FORMS)}")
    found = []
    for kind in kinds:
        form = epilogues.find_form(lib_symbol, sig, kind)
        if form is None:
            if required:
                raise ValueError(f"{lib_symbol}::{sig.qualified} has no {kind} form to derive")
            continue
        found.append((kind, form))
    return found
