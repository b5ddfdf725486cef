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


class UsableRows:
    """A table's rows as they count now: calibration rows per (op, dtype), first-use verdicts per cell.

    Built in one pass over the rows, a constant few operations a row (whether a kernel is stale is
    asked once per (DSL, op, kernel), not once per row); the cells and DSLs of the calibration rows
    are gathered from the groups when first asked for.
    """

    def __init__(self, header: dict[str, Any], rows: list[dict[str, Any]]):
        self.generation = versions.generation
        stale: dict[tuple[str, str, str | None], bool] = {}  # (dsl, op, the row's own kernel) -> stale
        groups: dict[Key, list[dict[str, Any]]] = {}
        self.first_use: dict[Cell, dict[int, bool]] = {}  # cell -> won, from first-use rows
        default = tables.DEFAULT_DSL
        for row in rows:
            dsl, op, kernel = row.get("dsl", default), row["op"], row.get("kernel")
            is_stale = stale.get((dsl, op, kernel))
            if is_stale is None:
                version = kernel or versions.recorded(header, dsl, op)
                is_stale = stale[(dsl, op, kernel)] = versions.is_stale(version, dsl, op)
            if is_stale:
                continue
            if row.get("first_use"):
                found = self.first_use.setdefault((dsl, op, row["dtype"]), {})
                for wide in tables.row_classes(row):
                    cell = 2 * row["bucket"] + wide
                    found[cell] = found.get(cell, True) and row["wins"] is True
                continue
            group = groups.get((op, row["dtype"]))
            if group is None:
                group = groups[(op, row["dtype"])] = []
            group.append(row)
        self.groups = groups
        self.stale = sorted({(dsl, op) for (dsl, op, _), is_stale in stale.items() if is_stale})
        self._exact: dict[Cell, set[int]] | None = None
        self._dsls: dict[Key, frozenset[str]] | None = None
        self._verdicts: dict[Key, dict[str, tables.Verdicts]] = {}

    @property
    def exact(self) -> dict[Cell, set[int]]:
        """The cells calibration rows measured, per (dsl, op, dtype)."""
        found = self._exact
        if found is None:
            found = {}
            for (op, dtype), group in self.groups.items():
                for row in group:
                    cells = found.setdefault((row.get("dsl", tables.DEFAULT_DSL), op, dtype), set())
                    cells.update(2 * row["bucket"] + wide for wide in tables.row_classes(row))
            self._exact = found
        return found

    @property
    def dsls(self) -> dict[Key, frozenset[str]]:
        """The DSLs with calibration rows, per (op, dtype)."""
        found = self._dsls
        if found is None:
            default = tables.DEFAULT_DSL
            found = self._dsls = {key: frozenset(r.get("dsl", default) for r in group) for key, group in self.groups.items()}
        return found

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
