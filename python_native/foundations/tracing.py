"""``pn.trace()``: a record of every routed call, paid for only while a trace is open.

Routers without recording run when no trace is open; opening the first trace swaps every slot
to its recording router and closing the last one swaps them back (see ``registry``). A trace
keeps at most ``capacity`` events (``DEFAULT_CAPACITY`` unless given) and counts the rest in
``dropped``, so a trace left open cannot grow without limit; each event is a slotted record whose
strings are shared (reasons are kept once each, at most ``MAX_REASON`` characters).
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from dataclasses import dataclass

from python_native.foundations import interrupts, module_scope, uncompiled
from python_native.foundations.trace_summary import TraceSummary, render, summarize

DEFAULT_CAPACITY = 100_000  # events kept per trace: about 10 MB
MAX_REASON = 1000  # characters of a reason kept in an event
OUTCOMES = ("override", "fallback")


@dataclass(frozen=True, slots=True)
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

    At most ``capacity`` events are kept; later ones are counted in ``dropped``. Entering and
    leaving are safe against interrupts (a ``KeyboardInterrupt`` in either leaves the trace closed
    and the routers as they were; see ``interrupts``). Inside a function ``torch.compile`` runs,
    the block runs eagerly, outside any graph, and records what it calls (see ``uncompiled``).
    """

    def __init__(self, on_open: Callable[[Trace], None], on_close: Callable[[Trace], None],
                 capacity: int = DEFAULT_CAPACITY):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"a trace's capacity is a number of events (an int >= 0), got {capacity!r}")
        self.events: list[TraceEvent] = []
        self.capacity = capacity
        self.dropped = 0
        self._on_open = on_open
        self._on_close = on_close
        self._paused: list[object] = []
        self.open = False  # whether it is recording now

    @uncompiled.entering
    def __enter__(self) -> Trace:
        paused = None
        try:
            paused = uncompiled.pause()
            self._paused.append(paused)
            self._on_open(self)  # the state change: the last step
            self.open = True
        except BaseException:
            self._close(paused)
            raise
        return self

    @uncompiled.entering
    @interrupts.unpolled_entry
    def __exit__(self, *exc_info: object) -> None:
        paused = self._paused[-1] if self._paused else None
        try:
            self._close(paused)  # the state change: the first step
        except BaseException:
            self._close(paused)  # an interrupt cut it short: finish it
            raise

    def _close(self, paused: object) -> None:
        """Stop recording, forget ``paused``, resume Dynamo: idempotent."""
        self.open = False
        self._on_close(self)
        for i in range(len(self._paused) - 1, -1, -1):
            if self._paused[i] is paused:
                del self._paused[i]
                break
        uncompiled.resume(paused)

    def _record(self, event: TraceEvent) -> None:
        if len(self.events) < self.capacity:
            self.events.append(event)
        else:
            self.dropped += 1

    def __reduce_ex__(self, protocol: object) -> tuple:
        raise TypeError(
            "cannot pickle a python_native Trace: it is tied to this process's routers; "
            "pickle trace.events (a list of TraceEvent, plain data) instead"
        )

    def ops(self, outcome: str | None = None) -> list[str]:
        """Op symbols of the recorded events, optionally only those with ``outcome`` ("override" or "fallback")."""
        if outcome is not None and outcome not in OUTCOMES:
            close = difflib.get_close_matches(str(outcome), OUTCOMES, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"no outcome is named {outcome!r}; {hint}(outcomes: {list(OUTCOMES)}, or None for all)")
        return [e.op for e in self.events if outcome is None or e.outcome == outcome]

    def summary(self) -> TraceSummary:
        """The events counted per op, outcome, DSL and reason: a list of ``SummaryRow``
        (``op, outcome, dsl, reason, count``) that prints as a table (``print(t.summary())``)."""
        return summarize(list(self.events), self.dropped)

    def table(self, limit: int | None = 20) -> str:
        """The events as a table, one per line, in call order; at most ``limit`` (None: all)."""
        events = list(self.events)  # a snapshot: other threads may still append
        shown = events if limit is None or len(events) <= limit else events[:limit]
        rows = (
            (str(i), e.op, e.dispatch_key, e.outcome,
             f"{e.override} [{e.variant}]" if e.variant not in (None, "default") else e.override or "-",
             e.module or "-", e.reason or "-")
            for i, e in enumerate(shown)
        )
        lines = render(("#", "op", "key", "outcome", "override", "module", "reason"), rows)
        if len(shown) < len(events):
            lines.append(f"... {len(events) - len(shown)} more (trace.table(limit=None) shows all)")
        if self.dropped:
            lines.append(f"... {self.dropped} more dropped beyond the trace's capacity ({self.capacity})")
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
        self._reasons: dict[str, str] = {}  # each reason kept once, shared by its events
        self.active = False  # read on every toggle: a plain attribute, not a property

    def add(self, trace: Trace) -> bool:
        """Open ``trace``; True when it is the first one (routers must start recording)."""
        with self._lock:
            self._open = (*self._open, trace)
            self.active = True
            return len(self._open) == 1

    def remove(self, trace: Trace) -> bool:
        """Close ``trace`` (idempotent); True when none is left open (routers may stop recording)."""
        with self._lock:
            self._open = tuple(t for t in self._open if t is not trace)
            self.active = bool(self._open)
            return not self._open

    def count(self) -> int:
        """How many traces are open now."""
        return len(self._open)

    @uncompiled.opaque
    def emit(self, template: tuple[str, str, str | None, str, str | None, str | None], reason: str | None = None) -> None:
        if reason is not None:
            kept = self._reasons.get(reason)
            if kept is None:
                kept = reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."
                if len(self._reasons) < 4096:
                    self._reasons[reason] = kept
            reason = kept
        event = TraceEvent(*template, thread=threading.get_ident(), reason=reason, module=module_scope.current())
        for trace in self._open:
            trace._record(event)
