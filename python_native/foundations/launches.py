"""Recorded launches: what the kernels of one impl call were given, for the compiled front to replay.

Backend-neutral. An impl that declares itself *replayable* (``declare_replayable``) promises that
for one specialization key (dtypes, sizes, strides, devices and scalar arguments of the call) it
always makes the same launches, in the same order, with arguments that are the call's tensors,
tensors it allocates itself (outputs and scratch), or constants; that it reads nothing back to the
host and decides nothing from tensor values; and that every write to device memory it makes goes
through a launch it reports here. The compiled front then serves later calls with the same key
from the launches it recorded (``python_native.features.front.replay``).

A backend's launcher reports each launch to ``current()`` when a recording is open on its thread
(``RECORDERS.threads`` tells it whether any thread records at all), or refuses the
recording with why (a launch replay cannot repeat: the interpreter, an unknown launcher layout).
A launcher may keep its own "nobody records" flag in step through ``on_recording_change``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

REPLAYABLE = "python_native_replayable"  # the attribute a replayable impl carries (True)

# Parameter type codes: "p" a pointer (a tensor, or None for a null pointer), else the number's type.
POINTER = "p"
NUMBER_CODES = frozenset({"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64"})


class Launch(NamedTuple):
    """One kernel launch as a device driver takes it (all dims as three ints)."""

    function: int  # the loaded kernel's handle (a CUfunction on CUDA)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # dynamic shared memory, bytes
    cluster: tuple[int, int, int]
    cooperative: bool
    pdl: bool  # programmatic dependent launch
    params: tuple[tuple[str, Any], ...]  # (code, value) per kernel parameter, in order


class Recording:
    """The launches of one impl call, or the first reason they cannot be replayed."""

    __slots__ = ("launches", "problem", "keep")

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.problem = ""
        self.keep: list[Any] = []  # what the launches' handles belong to (compiled kernels)

    def add(self, launch: Launch, keep: Any = None) -> None:
        """Append ``launch``; ``keep`` (its compiled kernel) stays alive as long as the process."""
        self.launches.append(launch)
        if keep is not None:
            self.keep.append(keep)

    def refuse(self, why: str) -> None:
        """This call cannot be replayed (the first reason is kept)."""
        if not self.problem:
            self.problem = why


class _Recorders:
    """How many threads record now (0: nothing to report), and who hears when that becomes or
    stops being 0 (a launcher keeps its own flag, read on every launch)."""

    __slots__ = ("threads", "listeners")

    def __init__(self) -> None:
        self.threads = 0
        self.listeners: list[Callable[[], None]] = []


RECORDERS = _Recorders()
_lock = threading.Lock()
_local = threading.local()
# Compiled kernels whose handles a record names: never let go (they are few, one per variant).
_KEPT: dict[int, Any] = {}


def current() -> Recording | None:
    """The recording open on this thread, if any."""
    return getattr(_local, "recording", None)


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record the launches made on this thread inside the block (an inner block records its own)."""
    rec = Recording()
    outer = current()
    _local.recording = rec
    with _lock:
        RECORDERS.threads += 1
        if RECORDERS.threads == 1:
            _notify()
    try:
        yield rec
    finally:
        _local.recording = outer
        with _lock:
            RECORDERS.threads -= 1
            if RECORDERS.threads == 0:
                _notify()
        for obj in rec.keep:
            _KEPT.setdefault(id(obj), obj)


def on_recording_change(fn: Callable[[], None]) -> None:
    """Call ``fn()`` whenever recording starts on a first thread or stops on the last one."""
    RECORDERS.listeners.append(fn)


def _notify() -> None:
    for fn in RECORDERS.listeners:
        fn()


def declare_replayable(fn: Any) -> Any:
    """Mark an impl replayable (see the module docstring); returns it."""
    setattr(fn, REPLAYABLE, True)
    return fn


def is_replayable(fn: Any) -> bool:
    """Whether ``fn`` declares itself replayable."""
    return getattr(fn, REPLAYABLE, False) is True
