"""Interrupts in the panel: a KeyboardInterrupt anywhere in a scope's or a trace's enter or exit
leaves no switch changed and no trace open; a trace left open cannot grow without limit."""

from __future__ import annotations

import ctypes
import random
import signal
import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub

X = torch.ones(2, 3)


def _scopes() -> dict[str, Callable[[], object]]:
    """Every kind of scope, and traces, as the user opens them (old and new forms alike)."""
    return {
        "op": lambda: pn.operations_disabled("sub"),
        "dsl": lambda: getattr(pn, TEST_DSL).disabled(),
        "key": lambda: pn.dispatch_keys_disabled("CPU"),
        "trace": lambda: pn.trace(),
    }


def _new_scopes() -> dict[str, Callable[[], object]]:
    return {
        "enable": lambda: pn.operations_enabled("sub"),
        "flags": lambda: pn.flags(enabled=False),
        "flags_dsl": lambda: pn.flags(**{TEST_DSL: False}),
        "dsl_flags": lambda: getattr(pn, TEST_DSL).flags(enabled=False),
        "keys_enabled": lambda: pn.dispatch_keys_enabled("CPU"),
        "variant": lambda: pn.override_variant("sub", "aten"),
        "compile_mode": lambda: pn.compile_mode_set("keep"),
    }


class _Cycles:
    """Enter and exit scopes (nested, as decorators, and traces) in a loop; ``phase`` says whether
    the loop is inside its ``try``, where an interrupt may be raised."""

    def __init__(self, factories: dict[str, Callable[[], object]], cycles: int, seed: int) -> None:
        self.factories = list(factories.values())
        self.cycles = cycles
        self.rng = random.Random(seed)
        self.phase = "idle"
        self.done = 0
        self.caught = 0
        self.stopped = False  # set by whoever interrupts, once every interrupt it sent was caught
        self.traces: list = []

    def one(self) -> None:
        first, second = self.rng.choice(self.factories), self.rng.choice(self.factories)
        outer = first()
        self.traces.append(outer)  # kept to check it is closed (traces); a scope is harmless to keep
        with outer:
            if self.rng.random() < 0.5:
                with second():
                    torch.sub(X, X)
            else:
                scope = second()
                if isinstance(scope, pn.Trace):
                    self.traces.append(scope)
                if callable(scope):
                    scope(torch.sub)(X, X)  # the decorator form
                else:
                    with scope:
                        torch.sub(X, X)

    def prime(self) -> None:
        """Each scope once, both forms, before any interrupt: the modules they import on first use
        are imported here. (An interrupt inside a first import can leave that module's import lock
        held for good: a hazard of CPython's import system, not of the scopes.)"""
        self.phase = "idle"
        for factory in self.factories:
            with factory():
                torch.sub(X, X)
            scope = factory()
            if callable(scope):
                scope(torch.sub)(X, X)
        pn._get_filter_state()  # what the final check reads

    def run(self, seconds: float = 120.0) -> None:
        """The cycles, then a wait (``phase`` "drain") inside the same ``try`` until ``stopped``: an
        interrupt sent as the last cycle ends is caught there, never raised past the loop."""
        deadline = time.monotonic() + seconds
        self.prime()
        while True:
            try:
                while self.done < self.cycles and time.monotonic() < deadline:
                    self.phase = "cycle"
                    self.one()
                    self.done += 1
                self.phase = "drain"
                while not self.stopped:
                    time.sleep(1e-4)  # no lock: an interrupt inside a lock's wait could leave it held
                return
            except KeyboardInterrupt:
                self.phase = "idle"
                self.caught += 1


def _assert_nothing_left(cycles: _Cycles) -> None:
    assert cycles.done == cycles.cycles, f"only {cycles.done} of {cycles.cycles} cycles ran in the time allowed"
    assert pn.enabled
    assert not pn.is_operation_disabled("sub") and not pn.is_dsl_disabled(TEST_DSL)
    assert not pn.is_dispatch_key_disabled("CPU")
    state = pn._get_filter_state()
    assert (set(state._dsl_names), set(state._op_symbols), set(state._dispatch_keys)) == (set(), set(), set())
    assert torch.equal(torch.sub(X, X), torch.full_like(X, 1000))  # routed: nothing switched off
    assert "_pn_trace(" not in pn.router_source("sub.Tensor", "CPU")  # no trace open anywhere
    assert [t for t in cycles.traces if isinstance(t, pn.Trace) and t.open] == []


def _interrupt_thread(cycles: _Cycles, seed: int) -> int:
    """Run ``cycles`` on a worker thread; raise KeyboardInterrupt into it at random points (one at
    a time, each once the previous was caught). Returns how many were raised."""
    rng = random.Random(seed)
    ident: list[int] = []
    worker = threading.Thread(target=lambda: (ident.append(threading.get_ident()), cycles.run()), daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2e-5)  # many thread switches: interrupts land everywhere
    sent = 0
    try:
        worker.start()
        while worker.is_alive():
            time.sleep(rng.random() * 3e-4)
            # ``caught`` before ``phase``: the worker sets "idle" before counting, so a count seen
            # up to date means the phase read after it is too (never a stale "cycle").
            if not ident or cycles.caught != sent:
                continue
            if cycles.phase == "cycle":
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident[0]), ctypes.py_object(KeyboardInterrupt))
                sent += 1
            elif cycles.phase == "drain":
                cycles.stopped = True  # every interrupt sent was caught: the worker may leave
        worker.join()
    finally:
        cycles.stopped = True
        sys.setswitchinterval(interval)
    assert cycles.caught == sent
    return sent


def _interrupt_signal(cycles: _Cycles, seed: int) -> int:
    """Run ``cycles`` in this (the main) thread; a SIGALRM handler raises KeyboardInterrupt at
    random points, as Ctrl-C does. Returns how many were raised."""
    rng = random.Random(seed)
    raised = [0]

    def handler(signum, frame):
        signal.setitimer(signal.ITIMER_REAL, 2e-5 + rng.random() * 3e-4)
        if cycles.phase == "cycle" and cycles.caught == raised[0]:
            raised[0] += 1
            raise KeyboardInterrupt

    cycles.stopped = True  # the handler raises synchronously in this thread: nothing to drain
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1e-4)
        cycles.run()
    finally:
        # Ignore first: a signal already delivered runs no handler that would arm the timer again
        # (and leave a SIGALRM for the default action, which ends the process).
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return raised[0]


@pytest.mark.parametrize("deliver", [pytest.param(_interrupt_thread, marks=pytest.mark.slow), _interrupt_signal],
                         ids=["async-exception", "signal"])
def test_interrupts_anywhere_in_scopes_and_traces_leave_nothing_behind(deliver, overrides):
    if deliver is _interrupt_signal and not hasattr(signal, "setitimer"):
        pytest.skip("no signal.setitimer on this platform")
    overrides("sub.Tensor", always, marked_sub)
    cycles = _Cycles(_scopes(), cycles=3000, seed=1)
    raised = deliver(cycles, seed=2)
    assert raised >= 200, f"only {raised} interrupts were raised: the test did not exercise the scopes"
    _assert_nothing_left(cycles)


def test_interrupts_in_enabling_scopes_flags_variants_and_compile_modes_leave_nothing_behind(overrides):
    overrides("sub.Tensor", always, marked_sub, variants={"other": marked_sub})
    cycles = _Cycles({**_scopes(), **_new_scopes()}, cycles=3000, seed=3)
    raised = _interrupt_thread(cycles, seed=4)
    assert raised >= 200
    _assert_nothing_left(cycles)
    assert pn.get_override_variant("sub") == "default" and pn.compile_mode == "bypass"


def test_an_interrupt_in_the_body_restores_like_any_exception(overrides):
    overrides("sub.Tensor", always, marked_sub)
    with pytest.raises(KeyboardInterrupt):
        with pn.operations_disabled("sub"), pn.flags(enabled=False), pn.trace() as t:
            raise KeyboardInterrupt
    assert not t.open and pn.enabled and not pn.is_operation_disabled("sub")


# ----- a trace's capacity -----


def test_a_trace_keeps_at_most_its_capacity_and_counts_the_rest(overrides):
    overrides("sub.Tensor", always, marked_sub)
    with pn.trace(capacity=5) as t:
        for _ in range(12):
            torch.sub(X, X)
    assert len(t.events) == 5 and t.dropped == 7
    assert "7 more dropped beyond the trace's capacity" in t.table()
    assert "7 more dropped" in str(t.summary())
    with pytest.raises(ValueError, match="capacity"):
        pn.trace(capacity=-1)


def test_the_default_capacity_is_documented_and_events_are_slotted():
    t = pn.trace()
    assert t.capacity == 100_000 and "100 000" in pn.trace.__doc__
    event = pn.TraceEvent("sub.Tensor", "CPU", None, "fallback", None, None, 1, "why")
    assert not hasattr(event, "__dict__")  # a fixed size per event: no per-instance dict


def test_a_forgotten_trace_stops_growing(overrides):
    overrides("sub.Tensor", always, marked_sub)
    t = pn.trace(capacity=100)
    t.__enter__()  # never exited, as a trace a program forgot
    try:
        for _ in range(300):
            torch.sub(X, X)
        assert len(t.events) == 100 and t.dropped == 200
    finally:
        t.__exit__(None, None, None)
    assert not t.open


def test_every_exit_of_the_panel_is_unpolled_on_entry_on_this_interpreter():
    """What the random interrupts above rely on: no exit can lose its first step to an interrupt."""
    from python_native.features.compiled.mode import mode_set
    from python_native.foundations import interrupts
    from python_native.panel.choices import VariantScope
    from python_native.panel.scopes import Scope

    if not interrupts.KNOWN:
        pytest.skip(f"an interpreter whose function entry cannot be left unpolled: {sys.version}")
    for fn in (Scope.__exit__, VariantScope.__exit__, pn.Trace.__exit__, mode_set.__exit__, interrupts.undo_last):
        assert interrupts.is_unpolled(fn), fn.__qualname__
