"""One reclaim queue: what was taken out of service, kept until no call can be inside it.

A removal takes a piece out of service at once (a slot's registration leaves the dispatcher, a
removed override's globals are rebound to pieces that hold nothing of the user's), but a call on
another thread may still be inside it, or on its way in. Whatever such a call needs (the
dispatcher's holder of a router, a compiled front, a slot's namespace, a removed override's
globals) is *retired* here and freed by one rule: no thread is inside the piece (no frame runs with
the slot's namespace as its globals, its in-flight count is 0), and no call can still be on its way
in. Only the dispatcher hands out a way in that Python cannot see: a call that looked a kernel up
just before it left may wait for the GIL before entering it, so a kept kernel (or front) also
waits out the grace period, which bounds that wait. Globals are only reached from frames: they go
as soon as no frame can look them up.

One sweeper thread frees what is due; ``settle()`` waits until nothing is left. The core retires
its routers, slots and removed overrides; a feature retires its own pieces through ``retire`` (the
compiled front retires its C++ fronts), so every removal follows the same rule.
"""

from __future__ import annotations

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

    __slots__ = ("what", "keep", "namespaces", "inflight", "release", "due")

    def __init__(self, what: str, keep: Any, namespaces: tuple[dict, ...], inflight: Callable[[], int] | None,
                 release: Callable[[], None] | None) -> None:
        self.what, self.keep, self.namespaces = what, keep, namespaces
        self.inflight, self.release = inflight, release
        # A kept kernel or front waits out the grace period: a call may have been handed it just before.
        self.due = time.monotonic() + (GRACE_SECONDS if keep is not None else 0.0)

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
        """Keep ``keep`` until ``what`` is free by the rule above; then drop it and call ``release()``.

        ``keep``: a kernel or front the dispatcher may have handed to a call (it waits out the grace
        period); ``namespaces``: a frame running with one of them as its globals is inside the piece;
        ``inflight()``: how many calls are inside it below Python (a C++ kernel's count).
        """
        entry = Retired(what, keep, tuple(namespaces), inflight, release)
        with self._lock:
            self._queue.append(entry)
        self.sweep()

    def sweep(self) -> None:
        """Free every retired piece that is due and that no thread is inside; look again later for the rest."""
        with self._lock:
            if not self._queue:
                return
            now = time.monotonic()
            due = [e for e in self._queue if e.due <= now]
            freed = []
            if due:
                running = _running_globals() if any(e.namespaces for e in due) else set()
                freed = [e for e in due if not e.busy(running)]
                if freed:
                    gone = set(map(id, freed))
                    self._queue = [e for e in self._queue if id(e) not in gone]
            self._schedule()
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
        wait = min(e.due for e in self._queue) - time.monotonic()
        self._sweeper = threading.Timer(max(wait, _RETRY_SECONDS), self._on_timer)
        self._sweeper.daemon = True
        self._sweeper.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._sweeper = None
        self.sweep()

    def _after_fork_in_child(self) -> None:
        """A forked child has only the forking thread: a lock another thread held stays held forever,
        the sweeper did not survive, and the in-flight counts of threads that are gone never drop."""
        self._lock = threading.Lock()
        self._sweeper = None
        for entry in self._queue:
            entry.inflight = None


def _running_globals() -> set[int]:
    """The ids of the globals of every frame on every thread's stack now."""
    found: set[int] = set()
    for frame in sys._current_frames().values():
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
