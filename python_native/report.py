"""The status report of ``python -m python_native``: torch, DSLs, overrides and switches at a glance.

``collect`` gathers plain data (also what ``--json`` prints and ``pn.status()`` returns);
``render`` lays it out for a terminal, keeping columns aligned: long reasons go on their own line.
Problems found with what python-native reads from outside (see ``faults``) come first.
"""

from __future__ import annotations

import json
import textwrap

from python_native.snapshot import LEGEND, collect

__all__ = ["LEGEND", "collect", "render", "to_json"]

WIDTH = 100
_INDENT = "      "


def _wrapped(text: str, indent: str = _INDENT) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def render(data: dict) -> str:
    lines = [f"torch {data['torch']}"]
    if data.get("problems"):
        lines += ["", f"Problems ({len(data['problems'])}): each costs only what depends on it"]
        for p in data["problems"]:
            lines += _wrapped(f"{p['source']}: {p['problem']}", "  ")
            lines += _wrapped(f"fix: {p['fix']}")
    lines += ["", "DSLs"]
    for d in data["dsls"]:
        lines.append(
            f"  {d['name']:<10} {'available' if d['available'] else 'unavailable':<12} "
            f"version {d['version'] or '-':<10} {'enabled' if d['enabled'] else 'disabled'}"
        )
        if d["reason"]:
            lines += _wrapped(f"why unavailable: {d['reason']}")
        if d["hint"]:
            lines += _wrapped(f"hint: {d['hint']}")
        for family, why in d["skipped"].items():
            lines += _wrapped(f"not installed: {family} ({why})")
    lines += ["", f"Overrides ({len(data['overrides'])})"]
    if not data["overrides"]:
        lines.append("  none installed here")
    rows = [(o["op"] + (f" (from {o['variant_of']})" if o["variant_of"] else ""), o) for o in data["overrides"]]
    width = max((len(label) for label, _ in rows), default=0)
    for label, o in rows:
        lines.append(
            f"  {label:<{width}}  {o['dispatch_key']:<6} {o['dsl']:<10} {'active' if o['active'] else 'inactive'}"
            + (f"  (registered through {o['origin']})" if o.get("origin") else "")
        )
        if o.get("slot_overrides", 1) > 1:
            lines += _wrapped(_order_note(o))
    if "compile" in data:
        c = data["compile"]
        lines += ["", f"torch.compile: compile_mode = {c['mode']!r} (one of {c['modes']})"]
        lines += _wrapped(
            "overrides run inside compiled graphs as opaque python_native ops: "
            + (", ".join(c["in_compiled_graphs"]) or "none")
            if c["mode"] == "keep"
            else "compiled graphs use Inductor's own kernels; eager calls keep their overrides "
            "(set pn.compile_mode = 'keep' to call the overrides from compiled code)"
        )
    if "calibration" in data:
        lines += ["", "Calibration (where each override beats aten, per device)"]
        lines += _calibration_lines(data["calibration"])
    lines += ["", "Environment switches"]
    for e in data["environment"]:
        value = "unset" if e["value"] is None else repr(e["value"])
        if e["set_by"] not in (None, e["name"]):
            value += f" (via {e['set_by']})"
        lines.append(f"  {e['name']} = {value}")
        lines += _wrapped(e["meaning"])
        if e.get("problem"):
            lines += _wrapped(f"problem: {e['problem']}")
    lines += ["", "Legend"]
    lines += [f"  {word:<12} {meaning}" for word, meaning in data["legend"].items()]
    return "\n".join(lines)


def _order_note(o: dict) -> str:
    """How an override shares its slot with others: its place, and what the calibration gate adds."""
    note = f"order {o['order']} of {o['slot_overrides']} on this op and key"
    if o["order"] == 1:
        note += " (tried first"
    else:
        note += " (tried when those before it decline or are switched off"
    if o.get("calibrated"):
        note += "; first when calibrated faster: it steps aside where another DSL here is calibrated faster"
    return note + ")"


def _calibration_lines(info: dict) -> list[str]:
    if info.get("error"):
        return _wrapped(f"tables unreadable ({info['source']}): {info['error']}")
    lines = [f"  tables from {info['source']}: {len(info['tables'])}"]
    lines += [f"    {t['device']}: {t.get('rows', '?')} rows ({t.get('path')})" for t in info["tables"]]
    if info["in_force"]:
        lines.append(f"  in force here: {info['in_force']}")
    else:
        device = info["device"] or "not known until a kernel runs on the GPU"
        lines += _wrapped(f"in force here: none (device {device}); every cond decides alone, as uncalibrated")
    return lines


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2)
