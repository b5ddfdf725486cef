"""``pn.trace()``: a record of every routed call, paid for only while a trace is open.

Routers without recording run when no trace is open; opening the first trace swaps every slot
to its recording variant and closing the last one swaps them back (see ``registry``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from python_native.foundations import module_scope, uncompiled


@dataclass(frozen=True)
class TraceEvent:
    """One routed call: which op, at which key, whether an override or the fallback ran, and why
    the fallback ran (``reason``: each override that declined or was switched off, with its DSL:
    ``"triton: not an outer product: inner dimension K > 1; cutedsl: DSL cutedsl disabled"``)."""

    op: str
    dispatch_key: str
    dsl: str | None
    outcome: str  # "override" | "fallback"
    override: str | None  # the override's name, None on fallback
    variant: str | None  # the override's variant that ran ("default" unless chosen), None on fallback
    thread: int
    reason: str | None = None  # why the fallback ran; None for an override
    module: str | None = None  # qualified name of the patched module the call ran in (``module_scope``)


class Trace:
    """Collects events from every thread while open; ``events`` stays readable after exit.

    Inside a function ``torch.compile`` runs, the block runs eagerly, outside any graph, and
    records what it calls (see ``uncompiled``).
    """

    def __init__(self, on_open: Callable[[Trace], None], on_close: Callable[[Trace], None]):
        self.events: list[TraceEvent] = []
        self._on_open = on_open
        self._on_close = on_close
        self._paused: list[object] = []

    @uncompiled.entering
    def __enter__(self) -> Trace:
        paused = uncompiled.pause()
        try:
            self._on_open(self)
        except BaseException:
            uncompiled.resume(paused)
            raise
        self._paused.append(paused)
        return self

    @uncompiled.entering
    def __exit__(self, *exc_info: object) -> None:
        try:
            self._on_close(self)
        finally:
            uncompiled.resume(self._paused.pop() if self._paused else None)

    def __reduce_ex__(self, protocol: object) -> tuple:
        raise TypeError(
            "cannot pickle a python_native Trace: it is tied to this process's routers; "
            "pickle trace.events (a list of TraceEvent, plain data) instead"
        )

    def ops(self, outcome: str | None = None) -> list[str]:
        """Op symbols of the recorded events, optionally only those with ``outcome``."""
        return [e.op for e in self.events if outcome is None or e.outcome == outcome]

    def table(self, limit: int | None = 20) -> str:
        """The events as a table, one per line, in call order; at most ``limit`` (None: all)."""
        events = list(self.events)  # a snapshot: other threads may still append
        shown = events if limit is None or len(events) <= limit else events[:limit]
        header = ("#", "op", "key", "outcome", "override", "module", "reason")
        rows = [
            (str(i), e.op, e.dispatch_key, e.outcome,
             f"{e.override} [{e.variant}]" if e.variant not in (None, "default") else e.override or "-",
             e.module or "-", e.reason or "-")
            for i, e in enumerate(shown)
        ]
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
        if len(shown) < len(events):
            lines.append(f"... {len(events) - len(shown)} more (trace.table(limit=None) shows all)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        events = len(self.events)
        if not events:
            return "Trace(0 events)"
        return f"Trace({events} event{'s' if events != 1 else ''}):\n{self.table()}"


class TraceHub:
    """The set of open traces; routers call ``emit`` with a prebuilt event template."""

    def __init__(self) -> None:
        self._open: tuple[Trace, ...] = ()
        self._lock = threading.Lock()
        self.active = False  # read on every toggle: a plain attribute, not a property

    def add(self, trace: Trace) -> bool:
        """Open ``trace``; True when it is the first one (routers must start recording)."""
        with self._lock:
            self._open = (*self._open, trace)
            self.active = True
            return len(self._open) == 1

    def remove(self, trace: Trace) -> bool:
        """Close ``trace``; True when none is left open (routers may stop recording)."""
        with self._lock:
            self._open = tuple(t for t in self._open if t is not trace)
            self.active = bool(self._open)
            return not self._open

    @uncompiled.opaque
    def emit(self, template: tuple[str, str, str | None, str, str | None, str | None], reason: str | None = None) -> None:
        event = TraceEvent(*template, thread=threading.get_ident(), reason=reason, module=module_scope.current())
        for trace in self._open:
            trace.events.append(event)
