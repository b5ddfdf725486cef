"""What a table's rows are worth in this process.

- Rows of an op whose kernels changed since they were timed (``versions.is_stale``: the row's
  ``kernel``, else the header's ``kernels`` entry for the op) count as unmeasured: they are
  dropped here, and the table names the op as stale.
- Rows a first use measured (``first_use``) speak for their own (bucket, width class) only: they
  are kept apart from the rows of calibration runs, whose verdicts fill the buckets between them.

Rebuilt when a declaration changes a version (``versions.generation``).
"""

from __future__ import annotations

from typing import Any

from python_native.features.calibration import tables, versions

Key = tuple[str, str]  # (op, dtype)
Cell = tuple[str, str, str]  # (dsl, op, dtype)


class Fresh:
    """A table's rows as they count now: calibration rows per (op, dtype), first-use verdicts per cell."""

    def __init__(self, header: dict[str, Any], rows: list[dict[str, Any]]):
        self.generation = versions.generation
        stale: dict[tuple[str, str, str | None], bool] = {}
        self.groups: dict[Key, list[dict[str, Any]]] = {}
        self.exact: dict[Cell, set[int]] = {}  # cells calibration rows measured
        self.first_use: dict[Cell, dict[int, bool]] = {}  # cell -> won, from first-use rows
        for row in rows:
            dsl, op = row.get("dsl", tables.DEFAULT_DSL), row["op"]
            version = row.get("kernel") or versions.recorded(header, dsl, op)
            if stale.setdefault((dsl, op, version), versions.is_stale(version, dsl, op)):
                continue
            cells = [2 * row["bucket"] + wide for wide in tables.row_classes(row)]
            key = (dsl, op, row["dtype"])
            if row.get("first_use"):
                found = self.first_use.setdefault(key, {})
                for cell in cells:
                    found[cell] = found.get(cell, True) and row["wins"] is True
                continue
            self.groups.setdefault((op, row["dtype"]), []).append(row)
            self.exact.setdefault(key, set()).update(cells)
        self.stale = sorted({(dsl, op) for (dsl, op, _), is_stale in stale.items() if is_stale})
        self.dsls = {key: frozenset(r.get("dsl", tables.DEFAULT_DSL) for r in group) for key, group in self.groups.items()}
        self._verdicts: dict[Key, dict[str, tables.Verdicts]] = {}

    def verdicts(self, op: str, dtype: str, dsl: str) -> tables.Verdicts | None:
        """``dsl``'s verdicts for (op, dtype) from the calibration rows, or None where there are none."""
        key = (op, dtype)
        found = self._verdicts.get(key)
        if found is None:
            group = self.groups.get(key)
            if group is None:
                return None
            found = self._verdicts[key] = tables.verdicts(group).get(key, {})
        return found.get(dsl)
