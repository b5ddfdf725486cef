"""Progress of a long run (``bench --calibrate``, ``precompile``): a bar with an ETA on a terminal, plain lines otherwise.

The bar is rich's (``pip install rich``, in the ``bench`` extra) when stderr is a terminal and rich
is installed; elsewhere (a log file, CI, a pipe) each step is one line with its count and the
estimated time left, so nothing needs a terminal to be read.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """``step(text)`` once per unit of work, then ``close()``, which returns the elapsed seconds (or
    use it as a context manager). ``quiet``: count the steps, print none of their lines."""

    def __init__(self, total: int, description: str, stream: TextIO | None = None, bar: bool | None = None,
                 quiet: bool = False):
        self.total, self.done, self.stream = max(total, 0), 0, stream or sys.stderr
        self.quiet = quiet
        self.start = time.perf_counter()
        self._bar: Any = None
        if bar is None:
            bar = bool(getattr(self.stream, "isatty", lambda: False)())
        if bar:
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
                bar = False
            else:
                self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                console=Console(file=self.stream), transient=False)
                self._task = self._bar.add_task(description, total=self.total)
                self._bar.start()

    def eta(self) -> float | None:
        """Seconds left at the pace so far (None before the first step)."""
        if not self.done:
            return None
        return (time.perf_counter() - self.start) / self.done * (self.total - self.done)

    def step(self, text: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1)
            if text and not self.quiet:
                self._bar.console.print(text, highlight=False, markup=False)
            return
        if self.quiet:
            return
        eta = self.eta()
        width = len(str(self.total))
        left = f"eta {_clock(eta)}" if eta is not None else ""
        print(f"[{self.done:>{width}}/{self.total}, {left}] {text}".rstrip(), file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> float:
        """Stop the bar; the elapsed seconds."""
        if self._bar is not None:
            self._bar.stop()
        return time.perf_counter() - self.start
