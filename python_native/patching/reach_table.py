"""The reach report's layout: the table per module class, then why calls fell back or stayed outside."""

from __future__ import annotations

from typing import Any

ReachReport = ReachRow = Any  # python_native.patching.reach's types (which import this module)

HANDED_BACK = "patched, but this call ran its own code: "  # the start of an outside reason: a declined call
HEADER = ("module class", "instances", "calls", "override", "fallback", "outside", "served by overrides")


def _served(row: ReachRow) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(row.override.items())) or "-"


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def render(report: ReachReport) -> str:
    """The whole report as text (what ``python -m python_native reach`` prints)."""
    patched = report.patch.patched
    how = (f"patched: {', '.join(sorted({e.rule for e in patched}))}" if patched else "no rule patched anything")
    lines = [f"pn.reach({report.model}): one training step at {report.key}; {how}", ""]
    rows = [(r.module_class, str(r.instances), str(r.calls), str(sum(r.override.values())),
             str(sum(r.fallback.values())), str(sum(r.outside.values())), _served(r))
            for r in sorted(report.rows.values(), key=lambda r: (-sum(r.override.values()), r.module_class))]
    lines += _grid([HEADER, *rows])
    served, fell_back, outside = report.totals()
    lines += ["", f"routed calls: {served} served by an override, {fell_back} fell back; "
                  f"{outside} module calls computed outside the package where a rule could take them"]
    fallbacks = [(r.module_class, op, why, n) for r in report.rows.values() for (op, why), n in r.fallback.items()]
    if fallbacks:
        lines += ["", "fell back (why):"]
        lines += [f"  {cls}: {op} x{n}: {why}" for cls, op, why, n in sorted(fallbacks)]
    outsiders = [(r.module_class, rule, why, n) for r in report.rows.values() for (rule, why), n in r.outside.items()]
    handed = sorted(o for o in outsiders if o[2].startswith(HANDED_BACK))
    if handed:
        lines += ["", "patched, but these calls ran their own code (a shape or dtype its probe did not confirm, "
                      "or no override active):"]
        lines += [f"  {cls}: {rule} x{n}: {why[len(HANDED_BACK):]}" for cls, rule, why, n in handed]
    left = sorted(o for o in outsiders if not o[2].startswith(HANDED_BACK))
    if left:
        lines += ["", "outside the package (a rule recognises them):"]
        lines += [f"  {cls}: {rule} x{n}: {why}" for cls, rule, why, n in left]
    if report.unserved:
        lines += ["", f"no override installed at {report.key} for: "
                      + ", ".join(f"python_native::{op}" for op in report.unserved) + " (their references ran)"]
    return "\n".join(lines)
