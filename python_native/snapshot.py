"""Everything the status report shows, as plain data: what ``pn.status()`` returns.

Gathered from the registry, the DSLs and the features; the ``report`` tool lays it out for a
terminal (``python -m python_native``) or prints it as JSON.
"""

from __future__ import annotations

import torch

from python_native import calibration, compiled, dsl_registry, env, front, native_bridge
from python_native.core.registry import REGISTRY

LEGEND = {
    "available": "the DSL's runtime is installed and can run kernels on this machine",
    "unavailable": "it cannot (the reason follows); its overrides are not installed or never fire",
    "enabled": "not switched off by pn.<dsl>.enabled = False, disable() or a disabled() scope",
    "active": "calls can reach the override now: its DSL, op and dispatch key are all switched on",
    "inactive": "installed but switched off (DSL, op or key disabled, or its DSL unavailable)",
}

def _hint(name: str, available: bool, version: str | None, reason: str | None) -> str | None:
    """What the user can do about an unavailable DSL, when we know."""
    if name == "triton" and not available and version is not None and reason and reason.startswith("no CUDA"):
        return (
            "set PYTHON_NATIVE_TRITON_INTERPRET=1 to run the Triton overrides on CPU through "
            "Triton's interpreter (slow; for trying and testing them)"
        )
    return None


def _skipped(name: str) -> dict[str, str]:
    """Op families the DSL left out here, with why (from its optional ``skipped_overrides()``)."""
    report = getattr(dsl_registry.get(name), "skipped_overrides", None)
    if not callable(report):
        return {}
    try:
        return dict(report())
    except Exception as e:  # a third-party DSL's report must not break ours
        return {"?": f"skipped_overrides() raised {type(e).__name__}: {e}"}


def _order_of(o) -> dict:
    """Where ``o`` stands in its slot: ``order`` (1 runs first) of ``slot_overrides``, and whether a
    calibration gate may hand its calls to a DSL calibrated faster (``calibrated``)."""
    slot = o.slot
    peers = list(slot.overrides) if slot is not None else [o]
    order = next((i for i, p in enumerate(peers, 1) if p is o), 1)
    return {
        "order": order,
        "slot_overrides": len(peers),
        "calibrated": getattr(o.routed_cond, "calibrated_dsl", None) == o.dsl,
    }


def collect() -> dict:
    """Torch version, every DSL, every override, the environment switches and a legend."""
    dsls = []
    for name in dsl_registry.names():
        version = dsl_registry.version(name)
        available = dsl_registry.available(name)
        reason = dsl_registry.unavailable_reason(name)
        dsls.append(
            {
                "name": name,
                "available": available,
                "reason": reason,
                "hint": _hint(name, available, str(version) if version is not None else None, reason),
                "version": str(version) if version is not None else None,
                "enabled": not REGISTRY.is_off("dsl", name),
                "operations": REGISTRY.dsl_operations(name),
                "skipped": _skipped(name),
            }
        )
    overrides = [
        {
            "op": f"{o.lib}::{o.op}",
            "dispatch_key": o.dispatch_key,
            "dsl": o.dsl,
            "name": o.name,
            "variant_of": o.derived_from.op if o.derived_from is not None else None,
            "active": o.active,
            "origin": native_bridge.origin_of(o),
            **_order_of(o),
        }
        for o in REGISTRY.overrides()
    ]
    return {
        "torch": torch.__version__,
        "dsls": dsls,
        "overrides": overrides,
        "calibration": calibration.describe(),
        "compile": compiled.describe(),
        "front": front.describe(),
        "environment": env.current(),
        "legend": dict(LEGEND),
    }
