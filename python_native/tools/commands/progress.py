"""N/total with an ETA for the long commands: a rich progress bar on a terminal, plain lines elsewhere.

On a terminal with ``rich`` installed (``pip install python-native[cutedsl]`` brings it) a bar shows
the count, the elapsed time and the time left, and each step's line prints above it. Elsewhere (a
pipe, a CI log) each step prints one plain line prefixed ``[N/total ETA m:ss]``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Counts ``total`` steps; ``step(line)`` marks one done and shows ``line`` (None: nothing)."""

    def __init__(self, total: int, description: str, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.total = total
        self.done = 0
        self.description = description
        self.stream = stream if stream is not None else sys.stdout
        self.quiet = quiet
        self._start = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self._start = time.perf_counter()
        if self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import Progress as Bar
            except ImportError:
                return self
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            console=Console(file=self.stream), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def eta(self) -> float:
        """Seconds left at the mean pace so far."""
        if not self.done:
            return 0.0
        return (time.perf_counter() - self._start) / self.done * (self.total - self.done)

    def step(self, line: str | None = None) -> None:
        self.done += 1
        if self._bar is not None:
            if line is not None and not self.quiet:
                self._bar.console.print(line, highlight=False, markup=False)
            self._bar.advance(self._task)
        elif line is not None and not self.quiet:
            width = len(str(self.total))
            print(f"[{self.done:>{width}}/{self.total} ETA {_clock(self.eta())}] {line}", file=self.stream, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
