"""Generate each slot's router as straight-line Python.

A router has the op's own signature, tests the active overrides' conds in order, calls the first
matching impl directly (no second trip through the dispatcher) and ends with the kernel captured
from the dispatcher (captured again if it went stale). Everything known at (re)generation time is baked in: which overrides are
active, which are unconditional, the mutation epilogue of derived in-place and ``out=`` ops, whether calls are
traced. Every router generated for a slot shares one signature, so swapping a slot to another is an
assignment to the registered function's ``__code__``: atomic, and in-flight calls keep the code
they started with.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Literal

from python_native.foundations.schema import OpSignature

Epilogue = Literal["functional", "inplace", "out"]

ENTRY_NAME = "_pn_router"
# The keyword an impl registered with ``impl_takes_plan=True`` receives its cond's result as.
PLAN_KEYWORD = "plan"


# The global naming ``python_native.core.errors.OverrideUnavailable`` in every router's namespace.
UNAVAILABLE_GLOBAL = "_pn_unavailable"
# Globals of traced routers only: ``_pn_reason(declines) -> str | None`` (why the fallback runs, the
# switched-off overrides added) and ``_pn_unavailable_reason(dsl, error) -> str``.
REASON_GLOBAL = "_pn_reason"
UNAVAILABLE_REASON_GLOBAL = "_pn_unavailable_reason"


@dataclass(frozen=True)
class RouteStep:
    """One active override as the generator sees it: the globals that hold its pieces."""

    cond: str | None  # global name of the cond, None for an unconditional override
    impl: str
    label: str  # global holding the profiler range name
    event: str  # global holding the trace event template
    epilogue: Epilogue
    takes_plan: bool = False  # the impl receives the cond's result as ``plan=``
    explain: str | None = None  # global holding the override's decline explainer (traced routers only)
    dsl: str = ""  # the override's DSL, named in a traced router's reasons


def _call_args(sig: OpSignature, *, skip_out: bool = False) -> str:
    if not sig.explicit:
        return "*args, **kwargs"
    parts = [p.name for p in sig.positional]
    parts += [f"{p.schema_name}={p.name}" for p in sig.keyword_only if not (skip_out and p.is_out)]
    return ", ".join(parts)


def default_global(param_name: str) -> str:
    return f"_pn_default_{param_name}"


def _header(sig: OpSignature) -> str:
    if not sig.explicit:
        return f"def {ENTRY_NAME}(_pn_keyset, *args, **kwargs):"
    parts = ["_pn_keyset"]
    for p in sig.positional:
        parts.append(f"{p.name}={default_global(p.name)}" if p.has_default else p.name)
    if sig.keyword_only:
        parts.append("*")
        for p in sig.keyword_only:
            parts.append(f"{p.name}={default_global(p.name)}" if p.has_default else p.name)
    return f"def {ENTRY_NAME}({', '.join(parts)}):"


def _impl_call(step: RouteStep, args: str, indent: str) -> list[str]:
    """Call the impl into ``_pn_result``, inside a profiler range only while profiling."""
    call = f"_pn_result = {step.impl}({args})"
    return [
        f"{indent}if _pn_profiler._is_profiler_enabled:",
        f"{indent}    with _pn_record_function({step.label}):",
        f"{indent}        {call}",
        f"{indent}else:",
        f"{indent}    {call}",
    ]


def _fallback(sig: OpSignature, indent: str) -> list[str]:
    """Call the captured kernel; numbers that arrived in Tensor parameters become tensors first."""
    lines = []
    if sig.explicit:
        tensors = [p.name for p in sig.params if p.tensor and not p.is_out]
        for name in tensors:
            peers = ", ".join(t for t in tensors if t != name)
            lines += [
                f"{indent}if {name}.__class__ in _pn_numbers:",
                f"{indent}    {name} = _pn_coerce({name}, ({peers}{',' if peers else ''}))",
            ]
    # The try costs nothing until the kernel raises; a captured kernel whose library was destroyed
    # since is then replaced by the one the dispatcher has now, and the call retried once.
    call = f"return _pn_fallback.call_boxed(_pn_keyset, {_call_args(sig)})"
    lines += [
        f"{indent}try:",
        f"{indent}    {call}",
        f"{indent}except RuntimeError as _pn_error:",
        f"{indent}    if not _pn_recapture(_pn_error):",
        f"{indent}        raise",
        f"{indent}{call}",
    ]
    return lines


def _epilogue(step: RouteStep, sig: OpSignature, indent: str) -> list[str]:
    if step.epilogue == "functional":
        return [f"{indent}return _pn_result"]
    if step.epilogue == "inplace":
        target = sig.positional[0].name
        return [
            f"{indent}if _pn_fits(_pn_result, {target}):",
            f"{indent}    {target}.copy_(_pn_result)",
            f"{indent}    return {target}",
            *_fallback(sig, indent),
        ]
    outs = [p.name for p in sig.keyword_only if p.is_out]
    if len(outs) == 1:
        return [
            f"{indent}if _pn_fits_out(_pn_result, {outs[0]}):",
            f"{indent}    _pn_write_out(_pn_result, {outs[0]})",
            f"{indent}    return {outs[0]}",
            *_fallback(sig, indent),
        ]
    checks = " and ".join(f"_pn_fits_out(_pn_result[{i}], {o})" for i, o in enumerate(outs))
    lines = [f"{indent}if {checks}:"]
    lines += [f"{indent}    _pn_write_out(_pn_result[{i}], {o})" for i, o in enumerate(outs)]
    lines += [f"{indent}    return ({', '.join(outs)},)", *_fallback(sig, indent)]
    return lines


def _nested_aten_check(sig: OpSignature, callers: bool, traced: bool, fallback_event: str) -> list[str]:
    """Straight to the captured kernel, untraced, while a switched-off op that calls this one runs
    aten's kernel in this thread (``_pn_nested_aten``, see ``core.nested_aten``); with ``callers``, also while the
    Python function calling it is a switched-off composite op (``_pn_callers``: its code -> its name),
    recorded as a fallback when traced (no other event shows that call)."""
    lines = ["    if _pn_nested_aten.depth:", *_fallback(sig, "        ")]
    if callers:
        lines += ["    _pn_caller = _pn_getframe(0).f_back",
                  "    _pn_caller = _pn_callers.get(_pn_caller.f_code) if _pn_caller is not None else None",
                  "    if _pn_caller is not None:"]
        if traced:
            lines.append(f"        _pn_trace({fallback_event}, 'inside ' + _pn_caller + ', which is disabled')")
        lines += _fallback(sig, "        ")
    return lines


def _guarded_fallback(sig: OpSignature) -> list[str]:
    """The captured kernel, with the guard up in this thread while it runs (``core.nested_aten``)."""
    return ["    _pn_nested_aten.depth += 1", "    try:", *_fallback(sig, "        "), "    finally:",
            "        _pn_nested_aten.depth -= 1"]


def router_source(
    sig: OpSignature,
    steps: list[RouteStep],
    *,
    traced: bool,
    fallback_event: str,
    comment: str,
    guarded: bool = False,
    checked: bool = False,
    callers: bool = False,
) -> str:
    """Source of one router for ``sig`` running ``steps`` in order.

    A traced router also collects why each override was passed over (``_pn_why``): on a decline it
    asks the override's explainer (only there: untraced routers never call it), and it hands the
    list to the fallback's trace event. ``guarded`` runs the fallback inside the guard of
    ``core.nested_aten``; ``checked`` (and ``callers``) make the router go straight to the captured
    kernel, untraced, while that guard is up.
    """
    lines = [f"# {comment}", _header(sig)]
    if checked and steps:
        lines += _nested_aten_check(sig, callers, traced, fallback_event)
    if traced:
        lines.append("    _pn_why = []")
    for step in steps:
        impl_args = _call_args(sig, skip_out=step.epilogue == "out")
        explain_args = impl_args
        if step.cond is None:
            indent = "    "
        elif step.takes_plan:
            # The cond's result is the plan: computed once, handed to the impl, never recomputed.
            lines.append(f"    _pn_plan = {step.cond}({impl_args})")
            lines.append("    if _pn_plan:")
            indent = "        "
            impl_args = f"{impl_args}, {PLAN_KEYWORD}=_pn_plan" if impl_args else f"{PLAN_KEYWORD}=_pn_plan"
        else:
            lines.append(f"    if {step.cond}({impl_args}):")
            indent = "        "
        if traced:
            lines.append(f"{indent}_pn_trace({step.event})")
        # An impl whose DSL turned out unable to run raises ``OverrideUnavailable``: the call goes
        # on as if its cond had declined (free until raised: a try costs nothing on 3.11+).
        lines.append(f"{indent}try:")
        lines += _impl_call(step, impl_args, indent + "    ")
        if traced:
            lines += [f"{indent}except {UNAVAILABLE_GLOBAL} as _pn_gone:",
                      f"{indent}    _pn_why.append({UNAVAILABLE_REASON_GLOBAL}({step.dsl!r}, _pn_gone))"]
        else:
            lines += [f"{indent}except {UNAVAILABLE_GLOBAL}:", f"{indent}    pass"]
        lines.append(f"{indent}else:")
        lines += _epilogue(step, sig, indent + "    ")
        if step.cond is None:
            break
        if traced and step.explain is not None:
            lines += ["    else:", f"        _pn_why.append({step.explain}({explain_args}))"]
    if traced:
        lines.append(f"    _pn_trace({fallback_event}, {REASON_GLOBAL}(_pn_why))")
    lines += _guarded_fallback(sig) if guarded else _fallback(sig, "    ")
    return "\n".join(lines) + "\n"


def compile_router(source: str, filename: str) -> types.CodeType:
    """Compile ``source`` and return the router function's code object."""
    module_code = compile(source, filename, "exec")
    for const in module_code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == ENTRY_NAME:
            return const
    raise AssertionError(f"generated source defines no {ENTRY_NAME}")


def make_function(code: types.CodeType, namespace: dict, sig: OpSignature, name: str) -> types.FunctionType:
    """Create the function the dispatcher calls, with the op's defaults bound once."""
    fn = types.FunctionType(code, namespace, name)
    if sig.explicit:
        positional_defaults = tuple(p.default for p in sig.positional if p.has_default)
        fn.__defaults__ = positional_defaults or None
        kw_defaults = {p.name: p.default for p in sig.keyword_only if p.has_default}
        fn.__kwdefaults__ = kw_defaults or None
    fn.__qualname__ = name
    return fn


def dump(source: str, filename: str) -> None:
    """Write a generated router to the dump folder (``PYTHON_NATIVE_DUMP_DIR``), through ``safe_write``.

    Dumping is for reading, never for routing: a folder that cannot be written is reported once
    (and in the status report) and the router is used all the same. A folder the write rules refuse
    (someone else could redirect what is written there: a link or another user's file at a router's
    name, a folder others can write to) is not written to again by this process.
    """
    from python_native.foundations import env, faults, safe_write

    folder = env.dump_dir()
    if folder is None or folder in _refused_dump_dirs:
        return
    variable = env.DUMP_DIR[0]
    try:
        safe_write.write(os.path.join(folder, filename), source)
    except safe_write.Untrusted as e:
        _refused_dump_dirs.add(folder)
        faults.report(variable, f"will not write generated routers to {folder!r}: {e.path} {e.why}",
                      f"{e.remedy}; routers are not dumped there by this process", stacklevel=2)
    except (OSError, ValueError) as e:  # ValueError: a path with a NUL byte
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        faults.report(variable, f"cannot write generated routers to {folder!r} ({why})",
                      "set it to a writable folder or unset it; routers are not dumped meanwhile", stacklevel=2)
    else:
        faults.resolve(variable)


_refused_dump_dirs: set[str] = set()  # dump folders the write rules refused: skipped from then on
