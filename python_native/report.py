"""The status report of ``python -m python_native``: torch, DSLs and overrides at a glance."""

from __future__ import annotations

import json

import torch

from python_native import compiled, dsl_registry
from python_native.registry import REGISTRY


def collect() -> dict:
    """Torch version, every DSL (availability, reason, version, enabled) and every override."""
    dsls = []
    for name in dsl_registry.names():
        version = dsl_registry.version(name)
        dsls.append(
            {
                "name": name,
                "available": dsl_registry.available(name),
                "reason": dsl_registry.unavailable_reason(name),
                "version": str(version) if version is not None else None,
                "enabled": not REGISTRY.is_off("dsl", name),
                "operations": REGISTRY.dsl_operations(name),
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
        }
        for o in REGISTRY.overrides()
    ]
    return {"torch": torch.__version__, "dsls": dsls, "overrides": overrides, "compile": compiled.describe()}


def render(data: dict) -> str:
    lines = [f"torch {data['torch']}", "", "DSLs"]
    for d in data["dsls"]:
        state = "available" if d["available"] else f"unavailable ({d['reason']})"
        lines.append(
            f"  {d['name']:<10} {state:<48} version {d['version'] or '-':<10} "
            f"{'enabled' if d['enabled'] else 'disabled'}"
        )
    lines += ["", f"Overrides ({len(data['overrides'])})"]
    if not data["overrides"]:
        lines.append("  none installed here")
    for o in data["overrides"]:
        variant = f" (from {o['variant_of']})" if o["variant_of"] else ""
        lines.append(
            f"  {o['op'] + variant:<48} {o['dispatch_key']:<6} {o['dsl']:<10} {'active' if o['active'] else 'inactive'}"
        )
    return "\n".join(lines)


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2)
