"""``trace.summary()``: a trace's events counted per op, outcome, DSL and reason.

A trace of a training step holds thousands of events; the summary says in a few lines what ran
(``softmax``: the Triton override 200 times) and why the rest fell back (``bmm``: not an outer
product, 50 times). It is plain data (a list of ``SummaryRow``) that prints as a table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple


class SummaryRow(NamedTuple):
    """How many events of one op had one outcome, DSL (None on fallback) and reason (None on override)."""

    op: str
    outcome: str
    dsl: str | None
    reason: str | None
    count: int


def render(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Rows as left-aligned columns under ``header``, two spaces apart."""
    rows = list(rows)
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


class TraceSummary(list):
    """The rows of ``trace.summary()``, most frequent first within each op (ops in first-call order);
    ``str()`` (or ``print``) gives the table. ``dropped`` counts events beyond the trace's capacity."""

    def __init__(self, rows: Iterable[SummaryRow], total: int, dropped: int) -> None:
        super().__init__(rows)
        self.total = total
        self.dropped = dropped

    def counts(self) -> dict[tuple[str, str, str | None, str | None], int]:
        """``{(op, outcome, dsl, reason): count}``."""
        return {(r.op, r.outcome, r.dsl, r.reason): r.count for r in self}

    def table(self) -> str:
        header = ("op", "outcome", "dsl", "count", "reason")
        lines = render(header, ((r.op, r.outcome, r.dsl or "-", str(r.count), r.reason or "-") for r in self))
        footer = f"{self.total} event{'s' if self.total != 1 else ''}"
        if self.dropped:
            footer += f", {self.dropped} more dropped beyond the trace's capacity"
        return "\n".join([*lines, footer])

    def __str__(self) -> str:
        return self.table()

    def __reduce__(self) -> tuple[Any, ...]:
        return (TraceSummary, (list(self), self.total, self.dropped))


def summarize(events: Sequence[Any], dropped: int) -> TraceSummary:
    """Count ``events`` (``TraceEvent``s) by op, outcome, DSL and reason."""
    counts = Counter((e.op, e.outcome, e.dsl, e.reason) for e in events)
    first_call = {op: i for i, op in reversed(list(enumerate(e.op for e in events)))}
    ordered = sorted(counts.items(), key=lambda item: (first_call[item[0][0]], -item[1], item[0][1]))
    return TraceSummary((SummaryRow(op, outcome, dsl, reason, n) for (op, outcome, dsl, reason), n in ordered),
                        len(events), dropped)
