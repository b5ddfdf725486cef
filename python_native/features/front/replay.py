"""Replay: a hit served by the compiled front from the launches recorded for its key.

When the Python router serves a hit of a *replayable* impl (``launches.declare_replayable``), the
launches it makes (handles, grids, parameters as references to the call's tensors, the outputs'
layouts) are recorded against the call's key. A later call with that key is served by the front
in C++: key from the boxed arguments, outputs allocated, kernels launched through the CUDA
driver, results pushed (``replay_*.h``). A key whose cond declined is recorded too: the shadowed
kernel serves it. Whatever cannot be replayed keeps the Python path.

A slot replays only while every active override's impl is replayable (checked mode's wrapper is
not), no trace is open, and replay is on. The recorder is put around replayable impls only while
replay is on (and taken off when it goes off), so that with replay off a hit pays nothing for it.
Every refresh of the slot (a toggle, a variant, a calibration change, a registration or removal,
a DSL found broken) gives its front a new epoch, which makes every record made before it
invisible at once; a recording that finishes after is never stored.

On by default only where a GPU run proved it for this GPU and these torch and Triton versions
(``proof``); ``PYTHON_NATIVE_REPLAY=1`` or ``0`` forces it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import weakref
from collections.abc import Iterator
from typing import Any

from python_native.core import extensions, routers
from python_native.core.registry import REGISTRY
from python_native.features.front import proof
from python_native.foundations import env, launches

log = logging.getLogger("python_native")

ENV = env.REPLAY[0]
CAPACITY = 64  # records per slot


class _Replay:
    """Whether replay is on and why, and every tracked front with its epoch cell."""

    def __init__(self) -> None:
        self.on = False
        self.why = "the compiled front is not serving"
        self.fronts: dict[Any, Any] = {}  # slot -> its C++ front
        self.cells: dict[Any, memoryview] = {}  # slot -> its front's epoch (0: off), while replay is on
        self.capacity = CAPACITY
        self.forced: bool | None = None  # set by ``forced``: what ``decide`` keeps while it holds


STATE = _Replay()
_epochs = itertools.count(1)


def _next_epoch() -> int:
    return next(_epochs) % 0xFFFFFFFF + 1  # never 0 (off)


def decide() -> None:
    """Replay on or off for this process: ``PYTHON_NATIVE_REPLAY``, else a proof for this machine."""
    if STATE.forced is not None:
        _switch(STATE.forced, f"forced {'on' if STATE.forced else 'off'}")
        return
    setting = env.replay_setting()
    if setting is not None:
        _switch(setting, f"{ENV}={int(setting)}")
        return
    try:
        proven, why = proof.find()
    except Exception as e:  # a broken proof must never cost the front
        proven, why = False, f"reading the proof failed: {type(e).__name__}: {e}"
    _switch(proven, why)


def _switch(on: bool, why: str) -> None:
    with REGISTRY.lock:
        STATE.why = why
        if on == STATE.on:
            return
        STATE.on = on
        if on:
            for slot, front in STATE.fronts.items():
                STATE.cells[slot] = front.replay_view().cast("I")
        _rewrap()
        REGISTRY.refresh_all()  # every slot's epoch follows (``follow``)
        if not on:
            for cell in STATE.cells.values():
                cell[0] = 0
                cell.release()
            STATE.cells.clear()


@contextlib.contextmanager
def forced(on: bool) -> Iterator[None]:
    """Replay on (or off) inside the block, whatever decided it for the process (tests, benchmarks, proofs)."""
    was, why, outer = STATE.on, STATE.why, STATE.forced
    STATE.forced = on
    _switch(on, f"forced {'on' if on else 'off'}")
    try:
        yield
    finally:
        STATE.forced = outer
        _switch(was, why)


# ----- following the front's slots (called by the front, under the registry's lock) -----


def track(slot: Any, front: Any) -> None:
    STATE.fronts[slot] = front
    front.replay_capacity = STATE.capacity
    if STATE.on:
        STATE.cells[slot] = front.replay_view().cast("I")


def untrack(slot: Any) -> None:
    cell = STATE.cells.pop(slot, None)
    if cell is not None:
        cell[0] = 0
        cell.release()
    STATE.fronts.pop(slot, None)


def follow(slot: Any) -> None:
    """After a refresh (replay on): a new epoch where the slot may replay now, else 0."""
    cell = STATE.cells.get(slot)
    if cell is None:
        return
    if replayable(slot):
        cell[0] = _next_epoch()
    elif cell[0]:
        cell[0] = 0


def replayable(slot: Any) -> bool:
    """Whether ``slot``'s calls may be replayed now: untraced, and every active override's routed
    impl (as the router calls it, through every wrapper) replayable and functional."""
    if slot.traced or not slot.active:
        return False
    return all(o.epilogue == "functional" and _replayable_impl(o.routed_impl) for o in slot.active)


def _replayable_impl(impl: Any) -> bool:
    """Declared replayable, and not wrapped by something that must see every call (checked mode's
    wrapper copies the impl's attributes, the declaration among them)."""
    return launches.is_replayable(impl) and not extensions.sees_every_call(impl)


# ----- recording (an impl wrapper, in place only while replay is on) -----

_wrapped: dict[int, Any] = {}  # id(recorder) -> the impl it wraps, for every recorder in place


def _rewrap() -> None:
    """Put the recorder around every replayable override's routed impl (replay on), or take it off
    (replay off: a hit then pays nothing for replay); the router's globals follow."""
    for slot in list(REGISTRY.slots.values()):
        for o in slot.overrides:
            current = o.routed_impl
            if STATE.on:
                fresh = recording(o, current)
            else:
                fresh = _wrapped.pop(id(current), current)
            if fresh is not current and not o._removed:
                o.routed_impl = fresh
                routers.bind(slot, o)


def recording(handle: Any, impl: Any) -> Any:
    """Wrap a replayable impl: where its front waits for this call's launches, record and hand them over."""
    if (not STATE.on or id(impl) in _wrapped or handle.epilogue != "functional"
            or not _replayable_impl(impl)):
        return impl
    slot = handle._slot
    state = STATE

    @functools.wraps(impl)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        if not state.on:
            return impl(*args, **kwargs)
        front = state.fronts.get(slot)
        if front is None or not front.replay_claim():
            return impl(*args, **kwargs)
        with launches.recording() as rec:
            result = impl(*args, **kwargs)
        try:
            front.replay_submit(rec.launches, rec.problem)
        except Exception:  # bookkeeping must never fail the call: this key keeps the Python path
            log.exception("python_native: recording a launch for replay failed")
        return result

    _wrapped[id(recorded)] = impl
    weakref.finalize(recorded, _wrapped.pop, id(recorded), None)
    return launches.declare_replayable(recorded)


def unwrap(impl: Any) -> Any:
    """The impl a recorder wraps (None: ``impl`` is no recorder)."""
    return _wrapped.get(id(impl))


# ----- status -----


def describe() -> dict[str, Any]:
    """On or off and why, and per slot that replays (or recorded something) what its records did."""
    slots = {}
    for slot, front in list(STATE.fronts.items()):
        stats = dict(front.replay_stats())
        cell = STATE.cells.get(slot)
        stats["replaying"] = bool(cell is not None and cell[0])
        if stats["replaying"] or stats["recorded"] or stats["refused"]:
            slots[slot.label] = stats
    return {"on": STATE.on, "why": STATE.why, "slots": slots}

