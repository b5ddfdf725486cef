"""Everything the status report shows, as plain data: what ``pn.status()`` returns.

Gathered from the registry and the DSLs, and from each feature through its ``Hooks.status``
(under the hook's ``status_key``: ``calibration``, ``compile``, ``front``...), so a feature reports
without this module naming it; the ``report`` tool lays it out for a terminal
(``python -m python_native``) or prints it as JSON.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import torch

from python_native.core import extensions
from python_native.core.registry import REGISTRY
from python_native.features import calibration
from python_native.foundations import custom_ops, dsl_registry, env, faults
from python_native.foundations.dispatch_keys import unreachable_reason
from python_native.foundations.switches import ALL
from python_native.panel import bootstrap as _bootstrap
from python_native.panel import native_bridge

LEGEND = {
    "available": "the DSL's runtime is installed and can run kernels on this machine",
    "unavailable": "it cannot (the reason follows); its overrides are not installed or never fire",
    "enabled": "not switched off by pn.<dsl>.enabled = False, disable() or a disabled() scope",
    "active": "calls can reach the override now: its DSL, op and dispatch key are all switched on",
    "inactive": "installed but switched off (pn.enabled False, DSL, op or key disabled, its DSL unavailable, "
                "or variant 'aten' chosen)",
    "never reached": "active, but at a dispatch key no tensor on this machine has (no device of that kind)",
    "variants": "the impls an override declares; the one running is marked * ('aten': the original kernel, "
                "the override passes calls through); choose with pn.set_override_variant or PYTHON_NATIVE_VARIANTS",
}

INTERPRETER_HINT = (
    f"set {env.TRITON_INTERPRET[0]}=1 to run the Triton overrides on CPU through "
    "Triton's interpreter (slow; for trying and testing them)"
)


def _hint(name: str, available: bool, version: str | None, reason: str | None) -> str | None:
    """What the user can do about an unavailable DSL, when we know."""
    if name == "triton" and not available and version is not None and reason and reason.startswith("no CUDA"):
        return INTERPRETER_HINT
    return None


def interpreter_hint() -> str | None:
    """How to run the kernels here when this machine has no GPU for them (the interpreter switch), or None."""
    version = dsl_registry.version("triton")
    return _hint("triton", dsl_registry.available("triton"), str(version) if version is not None else None,
                 dsl_registry.unavailable_reason("triton"))


def no_override_reason() -> str | None:
    """Why no override can take a call in this process because no DSL can run here, ending with
    what to do; None when one can (or when the user switched them off: that is no surprise)."""
    if any(o.active and unreachable_reason(o.dispatch_key) is None for o in REGISTRY.overrides()):
        return None
    if env.overrides_disabled():
        return f"{env.DISABLE_ALL[0]}=1 turns every override off for this process"
    no_gpu = not torch.cuda.is_available()
    if dsl_registry.version("triton") is None:
        return ("triton is not installed: pip install 'python-native[triton]'"
                + (f", then start Python with {env.TRITON_INTERPRET[0]}=1 (no GPU here)" if no_gpu else ""))
    if interpreter_hint() is not None:
        return (f"no GPU here and Triton's interpreter is off; set {env.TRITON_INTERPRET[0]}=1 before starting Python "
                f"to run the Triton kernels on CPU ({env.TRITON_INTERPRET[0]}=1 python -m python_native lists them)")
    if any(dsl_registry.available(name) for name in _bootstrap.BUILTIN_DSLS):
        return None
    return "; ".join(f"{name}: {dsl_registry.unavailable_reason(name)}" for name in _bootstrap.BUILTIN_DSLS) or None


def warn_if_nothing_runs(stacklevel: int) -> None:
    """Warn, once per calling line, that a trace opened now records no routed call, and why."""
    why = no_override_reason()
    if why is not None:
        warnings.warn(f"python_native: this trace will record no override: {why}", UserWarning, stacklevel=stacklevel + 1)


def _skipped(name: str) -> dict[str, str]:
    """Op families the DSL left out here, with why (from its optional ``skipped_overrides()``)."""
    report = getattr(dsl_registry.get(name), "skipped_overrides", None)
    if not callable(report):
        return {}
    try:
        return dict(report())
    except Exception as e:  # a third-party DSL's report must not break ours
        return {"?": f"skipped_overrides() raised {type(e).__name__}: {e}"}


def _note(name: str, available: bool, operations: list[str], skipped: dict[str, str]) -> str | None:
    """Why an available DSL has no override installed, or why its overrides no longer match the
    switches of this process; None when there is nothing to say."""
    module = dsl_registry.get(name)
    changed = getattr(module, "settings_changed", None)
    problem = changed() if callable(changed) else None
    if problem:
        return problem
    if not available or operations:
        return None
    if env.overrides_disabled():
        return f"no override installed: {env.DISABLE_ALL[0]} turns every override off for this process"
    if skipped:
        return "no override installed: every op family was left out here (see 'not installed')"
    if name in _bootstrap.BUILTIN_DSLS and not _bootstrap.installed(name):
        return "no override installed: its overrides could not be installed at import (see the python_native log)"
    return "no override installed"


def _order_of(o) -> dict:
    """Where ``o`` stands in its slot: ``order`` (1 runs first) of ``slot_overrides``, and whether a
    calibration gate may hand its calls to a DSL calibrated faster (``calibrated``)."""
    slot = o.slot
    peers = list(slot.overrides) if slot is not None else [o]
    order = next((i for i, p in enumerate(peers, 1) if p is o), 1)
    return {
        "order": order,
        "slot_overrides": len(peers),
        "calibrated": getattr(calibration.gate_of(o.routed_cond), "dsl", None) == o.dsl,
    }


def _dsl_entry(name: str) -> dict:
    version = dsl_registry.version(name)
    available = dsl_registry.available(name)
    reason = dsl_registry.unavailable_reason(name)
    operations = REGISTRY.dsl_operations(name)
    skipped = _skipped(name)
    return {
        "name": name,
        "available": available,
        "reason": reason,
        "hint": _hint(name, available, str(version) if version is not None else None, reason),
        "version": str(version) if version is not None else None,
        "enabled": not REGISTRY.is_off("dsl", name),
        "operations": operations,
        "skipped": skipped,
        "note": _note(name, available, operations, skipped),
    }


def _override_entry(o) -> dict:
    return {
        "op": f"{o.lib}::{o.op}",
        "dispatch_key": o.dispatch_key,
        "dsl": o.dsl,
        "name": o.name,
        "derived_from": o.derived_from.op if o.derived_from is not None else None,
        "active": o.active,
        "unreachable": unreachable_reason(o.dispatch_key),
        "origin": native_bridge.origin_of(o),
        "variants": list(o.variants),
        "variant": o.variant,
        **_order_of(o),
    }


def _custom_op_entry(d) -> dict:
    return {"op": f"{custom_ops.NAMESPACE}::{d.name}", "kind": d.kind, "autograd": d.autograd, "doc": d.doc}


class _Sections:
    """Runs each part of the snapshot; a part that raises becomes a problem of the report, so the
    report itself never raises (it is what a user reads when something is wrong)."""

    def __init__(self) -> None:
        self.problems: list[dict[str, str]] = []

    def run(self, what: str, fn: Callable[[], Any], empty: Any) -> Any:
        try:
            return fn()
        except Exception as e:
            self.problems.append({
                "source": f"status report: {what}",
                "problem": f"gathering it raised {type(e).__name__}: {e}",
                "fix": "the rest of the report stands; please report this as a bug",
            })
            return empty

    def each(self, what: str, items: Callable[[], list], entry: Callable[[Any], dict]) -> list[dict]:
        entries = []
        for item in self.run(what, items, []):
            built = self.run(f"{what} {item!r}", lambda item=item: entry(item), None)
            if built is not None:
                entries.append(built)
        return entries


# The keys of the snapshot's own data (``no_override_runs``: added by the status command); every
# other key is a feature's section.
OWN_KEYS = ("torch", "enabled", "dsls", "overrides", "custom_ops", "environment", "legend", "problems",
            "no_override_runs")


def _plain(section: Any) -> Any:
    """``section`` itself, once it is known to print as JSON (``--json`` prints what is here)."""
    json.dumps(section)  # TypeError naming the type that is not
    return section


def _feature_sections(sections: _Sections) -> dict[str, Any]:
    """Each feature's status section by its key, in hook order (a section that raised is left out)."""
    found: dict[str, Any] = {}
    for feature, key, status in sections.run("features", extensions.status_sections, []):
        if key in OWN_KEYS:
            sections.problems.append({
                "source": f"status report: the {feature!r} feature",
                "problem": f"its status key {key!r} is one of the report's own keys {list(OWN_KEYS)}; its section is left out",
                "fix": "give its Hooks a status_key of its own",
            })
            continue
        value = sections.run(f"the {feature!r} feature's status", lambda status=status: _plain(status()), None)
        if value is not None:
            found[key] = value
    return found


def collect() -> dict:
    """Torch version, every DSL, every override, the custom ops (outside aten), each feature's
    section, the environment switches, the problems found with any of them (see ``faults``) and a
    legend. Never raises."""
    sections = _Sections()
    data = {
        "torch": torch.__version__,
        "enabled": not REGISTRY.is_off("all", ALL),  # the master switch, pn.enabled
        "dsls": sections.each("DSL", dsl_registry.names, _dsl_entry),
        "overrides": sections.each("override", REGISTRY.overrides, _override_entry),
        "custom_ops": sections.each("custom op", custom_ops.defined, _custom_op_entry),
        **_feature_sections(sections),
        "environment": sections.run("environment switches", env.current, []),
        "legend": dict(LEGEND),
    }
    data["problems"] = sections.run("problems", faults.current, []) + sections.problems
    return {key: value for key, value in data.items() if value is not None}
