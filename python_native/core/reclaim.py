"""One reclaim queue: what was taken out of service, kept until no call can be inside it.

A removal takes a piece out of service at once (a slot's registration leaves the dispatcher, a
removed override's globals are rebound to pieces that hold nothing of the user's), but a call on
another thread may be on its way into it: the dispatcher looked the kernel up and the call waits
for the GIL, or a router frame is running. Whatever such a call still needs (the dispatcher's
holder of a router, a compiled front, a removed override's globals) is *retired* here, and freed
by one rule: the grace period has passed (a call that looked the piece up before it left has
entered it by then), and no thread is inside it now (no frame runs with the slot's namespace as
its globals, the piece's in-flight count is 0). Where no other thread exists, no call can be on
its way in, so only the second half applies and the piece goes at once.

One sweeper thread frees what is due; ``settle()`` waits until nothing is left. The core retires
its routers, slots and removed overrides; a feature retires its own pieces through ``retire`` (the
compiled front retires its C++ fronts), so every removal follows the same rule.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

GRACE_SECONDS = 1.0
_RETRY_SECONDS = 0.25  # how soon the sweeper looks again at a piece a thread was inside


class Retired:
    """One piece out of service: what it keeps alive, how to tell a thread is inside, what to run when freed."""

    __slots__ = ("what", "keep", "namespaces", "inflight", "release", "since")

    def __init__(self, what: str, keep: Any, namespaces: tuple[dict, ...], inflight: Callable[[], int] | None,
                 release: Callable[[], None] | None) -> None:
        self.what, self.keep, self.namespaces = what, keep, namespaces
        self.inflight, self.release = inflight, release
        self.since = time.monotonic()

    def busy(self, running: set[int]) -> bool:
        """Whether a thread is inside now (``running``: the ids of the globals of every frame running)."""
        if self.inflight is not None and self.inflight() > 0:
            return True
        return any(id(ns) in running for ns in self.namespaces)


class Reclaimer:
    """The queue of retired pieces, its sweeper and ``settle``."""

    def __init__(self) -> None:
        self._queue: list[Retired] = []  # in retirement order
        self._lock = threading.Lock()
        self._sweeper: threading.Timer | None = None

    def retire(self, what: str, keep: Any = None, *, namespaces: Iterable[dict] = (),
               inflight: Callable[[], int] | None = None, release: Callable[[], None] | None = None) -> None:
        """Keep ``keep`` (and run nothing) until ``what`` is free by the grace rule; then drop it and call
        ``release()``. ``namespaces``: a frame running with one of them as globals is inside the piece;
        ``inflight()``: how many calls are inside it below Python (a C++ kernel's count)."""
        entry = Retired(what, keep, tuple(namespaces), inflight, release)
        with self._lock:
            self._queue.append(entry)
        self.sweep()

    def sweep(self) -> None:
        """Free every retired piece that is due and that no thread is inside; look again later for the rest."""
        with self._lock:
            if not self._queue:
                return
            frames = sys._current_frames()
            alone = not (frames.keys() - {threading.get_ident(), self._sweeper_ident()})
            deadline = time.monotonic() - GRACE_SECONDS
            due = self._queue if alone else list(itertools.takewhile(lambda e: e.since <= deadline, self._queue))
            freed = []
            if due:
                running = _running_globals(frames.values()) if any(e.namespaces for e in due) else set()
                freed = [e for e in due if not e.busy(running)]
                if freed:
                    gone = set(map(id, freed))
                    self._queue = [e for e in self._queue if id(e) not in gone]
            self._schedule()
        del frames
        for entry in freed:  # outside the lock: a release or a destructor may retire something itself
            if entry.release is not None:
                entry.release()
        del freed

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until every retired piece is freed; True when none is left within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.sweep()
            if not self._queue:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def pending(self) -> list[str]:
        """What waits to be freed, oldest first."""
        with self._lock:
            return [e.what for e in self._queue]

    def _schedule(self) -> None:
        """Start the sweeper for what is left, unless it runs already (the caller holds the lock)."""
        if not self._queue or self._sweeper is not None:
            return
        first_due = self._queue[0].since + GRACE_SECONDS - time.monotonic()
        self._sweeper = threading.Timer(max(first_due, _RETRY_SECONDS), self._on_timer)
        self._sweeper.daemon = True
        self._sweeper.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._sweeper = None
        self.sweep()

    def _sweeper_ident(self) -> int | None:
        """The sweeper's thread: never inside a piece, so it counts as no other thread."""
        sweeper = self._sweeper
        return sweeper.ident if sweeper is not None else None

    def _after_fork_in_child(self) -> None:
        """A forked child has only the forking thread: a lock another thread held stays held forever,
        the sweeper did not survive, and the in-flight counts of threads that are gone never drop."""
        self._lock = threading.Lock()
        self._sweeper = None
        for entry in self._queue:
            entry.inflight = None


def _running_globals(frames: Iterable[Any]) -> set[int]:
    """The ids of the globals of every frame on the given threads' stacks."""
    found: set[int] = set()
    for frame in frames:
        while frame is not None:
            found.add(id(frame.f_globals))
            frame = frame.f_back
    return found


RECLAIMER = Reclaimer()
retire = RECLAIMER.retire
sweep = RECLAIMER.sweep
settle = RECLAIMER.settle
pending = RECLAIMER.pending

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RECLAIMER._after_fork_in_child)
