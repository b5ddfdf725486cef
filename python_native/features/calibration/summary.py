"""What the status report and the ``calibration`` command show: every table found, what was skipped
and why, and for each device this process can see, which source gates it, the ops it leaves out
and the sizes from which each override fires."""

from __future__ import annotations

from typing import Any

from python_native.features.calibration import first_use, gates, measure, portable, resolve, sources, tables
from python_native.foundations import nvml


def ranges(verdicts: tables.Verdicts, wide: int) -> list[list[int]]:
    """The size-bucket ranges ``[first, last]`` (0..63) of a width class where the verdict lets the override fire."""
    out: list[list[int]] = []
    for b in range(64):
        if verdicts[2 * b + wide] is not False:
            if out and out[-1][1] == b - 1:
                out[-1][1] = b
            else:
                out.append([b, b])
    return out


def _source_name(source: Any) -> str:
    return "portable policy" if isinstance(source, portable.Policy) else getattr(source, "path", "?")


def first_uses(found: resolve.Resolution) -> list[dict[str, Any]]:
    """Every first-use verdict in force for a device, with where it comes from (a table's path, or
    ``"this process"``), strongest first per cell."""
    out, seen = [], set()
    learned = [("this process", (found.device, dsl, op, dtype), cells)
               for (dsl, op) in sorted(first_use.learned_ops(found.device))
               for dtype in sorted(first_use.learned_dtypes(found.device, dsl, op))
               for cells in [first_use.learned(found.device, dsl, op, dtype)]]
    in_tables = [(t.path, (found.device, *key), cells) for t in found.tables for key, cells in t.usable.first_use.items()]
    for source, (_, dsl, op, dtype), cells in learned + in_tables:
        for cell, won in sorted(cells.items()):
            if (dsl, op, dtype, cell) not in seen:
                seen.add((dsl, op, dtype, cell))
                out.append({"dsl": dsl, "op": op, "dtype": dtype, "bucket": cell // 2,
                            "rows": "wide" if cell % 2 else "narrow", "fires": won, "source": source})
    return out


def _device(key: str, seen_by: str) -> dict[str, Any]:
    found = resolve.resolution(key)
    thresholds: dict[str, dict[str, dict[str, Any]]] = {}
    measured = first_uses(found)
    for dsl, op in sorted(found.ops()):
        per_dtype = thresholds.setdefault(dsl, {}).setdefault(op, {})
        for dtype in sorted(found.dtypes(dsl, op)):
            source = found.source_and_verdicts(dsl, op, dtype)[0]
            verdicts = found.verdicts(dsl, op, dtype, measuring=False)
            if verdicts is not None:
                mine = any((m["dsl"], m["op"], m["dtype"]) == (dsl, op, dtype) for m in measured)
                name = " and ".join(n for n in (_source_name(source) if source else "", "first use" if mine else "") if n)
                per_dtype[dtype] = {"narrow": ranges(verdicts, 0), "wide": ranges(verdicts, 1), "source": name}
    gated_by: list[dict[str, Any]] = [{"kind": "table", **t.info()} for t in found.tables]
    if found.policy is not None and found.policy.cells:
        gated_by.append(found.policy.describe())
    return {
        "device": key,
        "seen_by": seen_by,
        "gated_by": gated_by,
        "left_out": {dsl: ops for dsl in sorted({d for d, _ in found.ops()})
                     if (ops := sorted(op for d, op in found.ops() if d == dsl and found.never_wins(dsl, op)))},
        "thresholds": thresholds,
        "measuring": found.measuring(),
        "first_use": measured,
    }


def _seen_devices() -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    running = resolve.running_device_key()
    if running is not None:
        seen[running] = "this process"
    for key in sorted(nvml.device_keys() or ()):
        seen.setdefault(key, "NVML")
    return list(seen.items())


def _use(table: sources.Table, devices: list[dict[str, Any]], evidence_paths: set[str]) -> str:
    for d in devices:
        paths = [g.get("path") for g in d["gated_by"] if g["kind"] == "table"]
        if paths and paths[0] == table.path:
            return f"in force for {d['device']}"
        if table.path in paths:
            return f"shadowed by {paths[0]} for {d['device']} (used where that one has no rows)"
    if table.path in evidence_paths:
        return "evidence for the portable policy"
    return "for a device not seen here"


def describe() -> dict[str, Any]:
    """Which tables are found and which gates each device, for the status report; never raises.

    ``{"mode", "source", "user_dir", "tables", "skipped", "devices", "left_out", "portable",
    "benchmark", "device", "in_force"}``: ``device`` is this process's device key (None while CUDA is not
    initialised: it is not initialised for a report), ``in_force`` the path of the table gating it
    (None: no table; the portable policy or the conds alone).
    """
    info: dict[str, Any] = {"mode": None, "source": None, "user_dir": None}
    try:
        if resolve.stale():
            gates.reset()
        cat = resolve.catalog()
        info.update(mode=cat.mode, source=cat.source, user_dir=str(cat.user_dir))
        found = cat.everything()
        devices = [_device(key, by) for key, by in _seen_devices()]
        evidence, notes = resolve.evidence()
        evidence_paths = {e.path for e in evidence}
        info["tables"] = [{**t.info(), "use": _use(t, devices, evidence_paths)}
                          for t in found if isinstance(t, sources.Table)]
        info["skipped"] = [s.info() for s in cat.skipped()]
        info["devices"] = devices
        info["left_out"] = gates.left_out()
        info["benchmark"] = {"mode": first_use.mode(), "variable": first_use.ENV_VAR,
                             "budget_ms": measure.BUDGET_MS, "threshold": measure.THRESHOLD}
        info["portable"] = {
            "margin_buckets": portable.MARGIN_BUCKETS,
            "assumed_for_unknown_gpus": dict(portable.ASSUMED),
            "evidence": [{"device": e.device, "path": e.path, "properties": e.properties} for e in evidence],
            "notes": notes,
        }
        running = resolve.running_device_key()
        info["device"] = running
        info["in_force"] = next((d["gated_by"][0]["path"] for d in devices
                                 if d["device"] == running and d["gated_by"] and d["gated_by"][0]["kind"] == "table"),
                                None)
    except Exception as e:  # the report must never fail: name what went wrong instead
        info.setdefault("tables", [])
        info.setdefault("skipped", [])
        info.setdefault("devices", [])
        info["error"] = f"{type(e).__name__}: {e}"
    return info
