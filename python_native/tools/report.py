"""The status report of ``python -m python_native``: torch, DSLs, overrides and switches at a glance.

``collect`` gathers plain data (also what ``--json`` prints and ``pn.status()`` returns);
``render`` lays it out for a terminal, keeping columns aligned: long reasons go on their own line.
Problems found with what python-native reads from outside (see ``faults``) come first.
"""

from __future__ import annotations

import json
import textwrap

from python_native.panel.snapshot import LEGEND, OWN_KEYS, collect

__all__ = ["LEGEND", "calibration_lines", "collect", "render", "to_json"]

WIDTH = 100
_INDENT = "      "


def _wrapped(text: str, indent: str = _INDENT) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False)


def render(data: dict) -> str:
    """The status report, section by section, from ``pn.status()``'s data."""
    lines = [f"torch {data['torch']}"]
    if data.get("enabled") is False:
        lines += ["", "pn.enabled is False: every override is off (pn.enabled = True, or leave pn.flags(enabled=False))"]
    if data.get("problems"):
        lines += ["", f"Problems ({len(data['problems'])}): each costs only what depends on it"]
        for p in data["problems"]:
            lines += _wrapped(f"{p['source']}: {p['problem']}", "  ")
            lines += _wrapped(f"fix: {p['fix']}")
    lines += _dsl_lines(data["dsls"]) + _override_lines(data["overrides"])
    if data.get("custom_ops"):
        lines += ["", "Custom ops, outside aten (overrides attach to them; their reference runs otherwise)"]
        op_width = max(len(d["op"]) for d in data["custom_ops"])
        for d in data["custom_ops"]:
            lines.append(f"  {d['op']:<{op_width}}  {d['kind']}{', autograd' if d['autograd'] else ''}")
            if d["doc"]:
                lines += _wrapped(d["doc"])
    for key, section in data.items():  # each feature's section (Hooks.status), in hook order
        if key not in OWN_KEYS:
            lines += _LAYOUTS.get(key, _section_lines)(key, section)
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


def _dsl_lines(dsls: list[dict]) -> list[str]:
    lines = ["", "DSLs"]
    for d in dsls:
        lines.append(
            f"  {d['name']:<10} {'available' if d['available'] else 'unavailable':<12} "
            f"version {d['version'] or '-':<10} {'enabled' if d['enabled'] else 'disabled'}"
        )
        if d["reason"]:
            lines += _wrapped(f"why unavailable: {d['reason']}")
        if d["hint"]:
            lines += _wrapped(f"hint: {d['hint']}")
        if d.get("note"):
            lines += _wrapped(f"note: {d['note']}")
        for family, why in d["skipped"].items():
            lines += _wrapped(f"not installed: {family} ({why})")
    return lines


def _override_lines(overrides: list[dict]) -> list[str]:
    lines = ["", f"Overrides ({len(overrides)})"]
    if not overrides:
        lines.append("  none installed here")
    rows = [(o["op"] + (f" (from {o['derived_from']})" if o["derived_from"] else ""), o) for o in overrides]
    width = max((len(label) for label, _ in rows), default=0)
    for label, o in rows:
        lines.append(
            f"  {label:<{width}}  {o['dispatch_key']:<6} {o['dsl']:<10} {'active' if o['active'] else 'inactive'}"
            + (f"  (registered through {o['origin']})" if o.get("origin") else "")
        )
        if o.get("unreachable"):
            lines += _wrapped(f"never reached: {o['unreachable']}")
        if len(o.get("variants", ())) > 1 or o.get("variant", "default") != "default":
            lines += _wrapped(_variants_note(o))
        if o.get("slot_overrides", 1) > 1:
            lines += _wrapped(_order_note(o))
    return lines


def _section_lines(key: str, section: object) -> list[str]:
    """A feature's section laid out plainly: a list line by line, a dict one ``field: value`` per line."""
    lines = ["", key[:1].upper() + key[1:]]
    if isinstance(section, dict):
        for field, value in section.items():
            shown = value if isinstance(value, str) else json.dumps(value, default=str)
            lines += _wrapped(f"{field}: {shown}", "  ")
    elif isinstance(section, list | tuple):
        lines += [line for item in section for line in _wrapped(str(item), "  ")]
    else:
        lines += _wrapped(str(section), "  ")
    return lines


def _calibration_section(key: str, info: dict) -> list[str]:
    return ["", "Calibration (where each override beats aten, per device)", *calibration_lines(info)]


def _compile_lines(key: str, c: dict) -> list[str]:
    lines = ["", f"torch.compile: compile_mode = {c['mode']!r} (one of {c['modes']})"]
    return lines + _wrapped(
        "overrides run inside compiled graphs as opaque python_native ops: "
        + (", ".join(c["in_compiled_graphs"]) or "none")
        if c["mode"] == "keep"
        else "compiled graphs use Inductor's own kernels; eager calls keep their overrides "
        "(set pn.compile_mode = 'keep' to call the overrides from compiled code)"
    )


def _front_lines(key: str, f: dict) -> list[str]:
    lines = ["", f"Dispatch front: {f['front']}"]
    lines += _wrapped(f"why: {f['why']}")
    if f.get("error"):
        lines += _wrapped(f"error: {f['error']}")
    replay = f.get("replay")
    if replay:
        lines += _wrapped(f"replay: {'on' if replay['on'] else 'off'} ({replay['why']})")
        served = sum(s.get("replayed", 0) + s.get("fallbacks", 0) for s in replay.get("slots", {}).values())
        if replay["on"]:
            lines += _wrapped(f"replayed calls so far: {served}, over {len(replay.get('slots', {}))} slots that replay")
    return lines


def _variants_note(o: dict) -> str:
    """The override's variants, the running one starred (``"aten"``: calls pass through)."""
    names = [*o["variants"], "aten"]
    return "variants: " + ", ".join(f"{n}*" if n == o["variant"] else n for n in names)


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


def _versions(t: dict) -> str:
    return ", ".join(f"{name} {v}" for name, v in (t.get("versions") or {}).items()) or "versions unknown"


def _size(ranges: list) -> str:
    """Bucket ranges as element counts: ``[[24, 63]]`` -> ``>=2^23``; ``[]`` -> ``never``."""
    if not ranges:
        return "never"
    if ranges == [[0, 63]]:
        return "always"
    parts = [f">=2^{max(lo - 1, 0)}" if hi == 63 else f"2^{max(lo - 1, 0)}..2^{hi}" for lo, hi in ranges]
    return " and ".join(parts)


def _device_lines(d: dict, detail: bool) -> list[str]:
    sources = []
    for g in d["gated_by"]:
        if g["kind"] == "table":
            drift = f"; measured with {', '.join(g['drift'])}: recalibrate" if g.get("drift") else ""
            sources.append(f"table {g['path']} ({g['origin']}; {_versions(g)}{drift})")
        else:
            assumed = f", assumed for {', '.join(g['assumed'])}" if g.get("assumed") else ""
            props = ", ".join(f"{k} {v:g}" for k, v in g["properties"].items())
            sources.append(f"the portable policy ({props}{assumed}; +{g['margin_buckets']} bucket margin)")
    if d.get("first_use") or d.get("measuring"):
        sources.insert(0, "first-use verdicts (pn.benchmark)")
    lines = _wrapped(f"device {d['device']} ({d['seen_by']}): gated by "
                     + ("; then ".join(sources) if sources else "nothing: every cond decides alone"), "  ")
    lines += _first_use_lines(d, detail)
    for dsl, ops in d["left_out"].items() if detail else ():
        lines += _wrapped(f"left out (never faster here): {dsl} {', '.join(ops)}", "    ")
    first = d["gated_by"][0].get("path", "portable policy") if d["gated_by"] else None
    for dsl, per_op in d["thresholds"].items():
        for op, per_dtype in per_op.items():
            if not detail and op in d["left_out"].get(dsl, []):
                continue
            cells = []
            for dtype, c in per_dtype.items():
                via = "" if c["source"] == first else f" ({'portable' if c['source'] == 'portable policy' else c['source']})"
                narrow, wide = _size(c["narrow"]), _size(c["wide"])
                cells.append(f"{dtype} {narrow}{via}" if narrow == wide else f"{dtype} narrow {narrow}, wide {wide}{via}")
            if all(cell.endswith(" never") for cell in cells):
                cells = ["never"]
            lines += _wrapped(f"{dsl} {op} fires for elements: " + "; ".join(cells), "    ")
    return lines


def _first_use_lines(d: dict, detail: bool) -> list[str]:
    """What pn.benchmark measured on a device (each verdict with its source, in detail)."""
    found = d.get("first_use") or []
    lines = []
    if d.get("measuring") or found:
        fires = sum(1 for m in found if m["fires"])
        doing = "measures sizes no table measured on first use (pn.benchmark); " if d.get("measuring") else ""
        lines += _wrapped(f"{doing}first-use verdicts: {len(found)} ({fires} where the override fires)", "    ")
    for m in found if detail else ():
        lo = max(m["bucket"] - 1, 0)
        lines += _wrapped(f"first use: {m['dsl']} {m['op']} {m['dtype']} 2^{lo}..2^{m['bucket']} elements, "
                          f"{m['rows']} rows: {'the override' if m['fires'] else 'aten'} ({m['source']})", "      ")
    return lines


def calibration_lines(info: dict, detail: bool = False) -> list[str]:
    """The calibration section: tables found (and skipped, with the fix), and per device what gates it."""
    lines = [f"  mode: {info.get('mode', '?')}; tables from {info.get('source', '?')}; user tables in {info.get('user_dir')}"]
    if info.get("error"):
        lines += _wrapped(f"could not be described: {info['error']}")
    bench = info.get("benchmark") or {}
    if bench.get("mode") or detail and bench:
        lines += _wrapped(f"pn.benchmark: {bench['mode']!r} (seeded by {bench['variable']}); a first use times "
                          f"override against aten for at most {bench['budget_ms']:g} ms", "  ")
    lines.append(f"  tables found: {len(info['tables'])}")
    for t in info["tables"]:
        lines += _wrapped(f"{t['device']}: {t.get('rows', '?')} rows, {_versions(t)} ({t['origin']}: {t['path']}); "
                          f"{t.get('use', '')}", "    ")
        if t.get("stale"):
            lines += _wrapped(f"stale (timed with other kernels than these, so unmeasured): {', '.join(t['stale'])}",
                              "      ")
    for s in info["skipped"]:
        lines += _wrapped(f"skipped {s['path']} ({s['origin']}): {s['reason']}", "    ")
        lines += _wrapped(f"fix: {s['fix']}", "      ")
    for d in info["devices"]:
        lines += _device_lines(d, detail)
    for key, per_dsl in (info.get("left_out") or {}).items():
        for dsl, ops in per_dsl.items():
            lines += _wrapped(f"not installed at {key}: {dsl} {', '.join(sorted(ops))} ({next(iter(ops.values()))})", "  ")
    if detail and info.get("portable"):
        p = info["portable"]
        lines.append(f"  portable policy: evidence {len(p['evidence'])} table(s), margin {p['margin_buckets']} bucket(s)")
        lines += [f"    {e['device']} ({e['path']})" for e in p["evidence"]]
        lines += [line for note in p["notes"] for line in _wrapped(note, "    ")]
    if info.get("in_force"):
        lines.append(f"  in force here: {info['in_force']}")
    elif any(d["device"] == info.get("device") and d["gated_by"] for d in info["devices"]):
        lines += _wrapped(f"in force here: the portable policy (device {info['device']})", "  ")
    elif any(d["device"] == info.get("device") and (d.get("first_use") or d.get("measuring")) for d in info["devices"]):
        lines += _wrapped(f"in force here: first-use verdicts (device {info['device']})", "  ")
    else:
        device = info.get("device") or "not known until a kernel runs on the GPU"
        lines += _wrapped(f"in force here: none (device {device}); every cond decides alone, as uncalibrated", "  ")
    return lines


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2)


# How the built-in features' sections are laid out, by status key; any other section plainly.
_LAYOUTS = {"calibration": _calibration_section, "compile": _compile_lines, "front": _front_lines}
