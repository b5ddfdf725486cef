"""An op destroyed and defined again under the same name is a new op to the panel.

Its old slot (waiting out the removal grace period, or still holding overrides) is never reused:
overrides registered against the new definition run, a call never reaches a router built for the
old schema, and the old slot's leaving touches nothing of the new one. Each test runs with another
thread alive (removal then waits for calls that may be on their way in) and without.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, compiled_front_problem
from python_native.core.registry import REGISTRY

NS, NAME = "pn_redefine", "foo"
SCHEMAS = {1: f"{NAME}(Tensor x) -> Tensor", 2: f"{NAME}(Tensor x, Tensor y) -> Tensor"}
KERNEL_KEYS = ["CPU", "CompositeExplicitAutograd"]  # where the definition's own kernel sits


@pytest.fixture(params=[True, False], ids=["other-thread", "alone"])
def other_thread(request):
    """Another thread alive (parked) for the test, or none."""
    if not request.param:
        yield False
        return
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    yield True
    stop.set()
    thread.join()


class Definition:
    """``pn_redefine::foo`` defined by a Library of its own; its kernel adds ``base`` to the sum of its inputs."""

    def __init__(self, arity: int, base: float, key: str) -> None:
        self.arity, self.base = arity, base
        self.lib = torch.library.Library(NS, "FRAGMENT")
        try:
            self.lib.define(SCHEMAS[arity])
            self.lib.impl(NAME, self.kernel, key)
        except BaseException:
            self.lib._destroy()
            raise

    def kernel(self, *tensors: torch.Tensor) -> torch.Tensor:
        return sum(tensors) + self.base

    def args(self) -> tuple[torch.Tensor, ...]:
        return (torch.ones(2),) * self.arity

    def call(self) -> float:
        return getattr(torch.ops, NS).foo(*self.args())[0].item()

    def override(self, value: float, **kwargs) -> pn.OverrideHandle:
        """An override of this definition returning ``value`` everywhere."""
        return pn.register_op_override(TEST_DSL, NS, NAME, "CPU", lambda *a: True,
                                       lambda *a: torch.full_like(a[0], value), **kwargs)

    def destroy(self) -> None:
        if self.lib.m is not None:
            self.lib._destroy()


@pytest.fixture
def define():
    """``define(arity, base, key)``: a Definition destroyed (with every override of the op removed) after the test."""
    made: list[Definition] = []

    def make(arity: int, base: float, key: str) -> Definition:
        made.append(Definition(arity, base, key))
        return made[-1]

    yield make
    for o in pn.overrides():
        if o.lib == NS:
            o.remove()
    for d in made:
        d.destroy()


def each_redefinition(test):
    """Run ``test`` under both fronts, with the definition's kernel at each key, for an op defined
    again with its schema (``arity`` 1) and with another (``arity`` 2)."""
    for mark in (pytest.mark.parametrize("arity", [1, 2], ids=["same-schema", "new-schema"]),
                 pytest.mark.parametrize("key", KERNEL_KEYS), pytest.mark.both_fronts):
        test = mark(test)
    return test


def _gone() -> None:
    """Nothing of ours is left on the op once its definition is destroyed and the removed pieces are freed."""
    assert REGISTRY.settle()
    assert torch._C._dispatch_dump(f"{NS}::{NAME}") == ""
    assert not [s for s in REGISTRY.slots if s[0] == NS]


@each_redefinition
def test_an_op_defined_again_routes_to_overrides_of_its_new_definition(arity, key, other_thread, define):
    first = define(1, 1.0, key)
    handle = first.override(10.0)
    assert first.call() == 10.0
    handle.remove()  # the slot's last override: its pieces wait out the grace where other threads live
    assert first.call() == 2.0
    first.destroy()
    second = define(arity, 2.0, key)
    assert second.call() == arity + 2.0  # the new kernel, not a router built for the old schema
    handle = second.override(100.0)
    assert second.call() == 100.0  # the new definition's override runs
    assert [o for o in pn.overrides() if o.lib == NS] == [handle]
    handle.remove()
    assert second.call() == arity + 2.0
    second.destroy()
    _gone()


@each_redefinition
def test_overrides_left_on_a_destroyed_op_follow_a_definition_with_its_schema_only(arity, key, other_thread, define):
    first = define(1, 1.0, key)
    old = first.override(10.0)
    first.destroy()  # the override is left registered
    second = define(arity, 2.0, key)
    new = second.override(100.0, priority=1)
    assert second.call() == 100.0
    new.remove()
    if arity == 1:  # the same arguments: the old override serves the new definition
        assert not old.removed and old in pn.overrides()
        assert second.call() == 10.0
    else:  # written for arguments the op no longer takes: removed
        assert old.removed and old not in pn.overrides()
    old.remove()
    assert second.call() == arity + 2.0
    second.destroy()
    _gone()


# ----- callers call while the op is destroyed, defined again and overridden -----

_STRESS = r"""
import sys, threading, time, traceback, types
from contextlib import contextmanager
import torch, torch.backends.python_native as pn
from python_native.core import reclaim
from python_native.features import front

SECONDS, FRONTS = float(sys.argv[1]), sys.argv[2].split(",")
NS = "pn_redefine_stress"
pn.register_dsl("redefdsl", types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: "1"))
x = torch.ones(2)


class Gate:
    # Calls run together; destroying and defining the op waits for the calls in flight and holds new
    # ones back: torch itself does not survive a call racing the destruction of its op's library.
    def __init__(self):
        self.cond, self.calls, self.redefining = threading.Condition(), 0, False

    @contextmanager
    def call(self):
        with self.cond:
            while self.redefining:
                self.cond.wait()
            self.calls += 1
        try:
            yield
        finally:
            with self.cond:
                self.calls -= 1
                self.cond.notify_all()

    @contextmanager
    def redefine(self):
        with self.cond:
            self.redefining = True
            while self.calls:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.redefining = False
                self.cond.notify_all()


def kernel_value(gen, arity):
    return arity + 10.0 * gen


def allowed(gen, arity):  # the kernel of this definition, or one of the overrides registered against it
    return {kernel_value(gen, arity), 100000.0 + gen, 200000.0 + gen}


def define(gen, arity, key):
    lib = torch.library.Library(NS, "FRAGMENT")
    lib.define("foo(Tensor x) -> Tensor" if arity == 1 else "foo(Tensor x, Tensor y) -> Tensor")
    lib.impl("foo", lambda *ts: sum(ts) + 10.0 * gen, key)
    return lib


def call(arity):
    return getattr(torch.ops, NS).foo(*(x,) * arity)[0].item()


def override(value, **kwargs):
    return pn.register_op_override("redefdsl", NS, "foo", "CPU", lambda *a: True,
                                   lambda *a: torch.full_like(a[0], value), **kwargs)


def run(seconds):
    gate, state, errors, calls, stop = Gate(), [0, 1], [], [0], threading.Event()

    def caller():
        try:
            while not stop.is_set():
                with gate.call():
                    gen, arity = state
                    got = call(arity)
                if got not in allowed(gen, arity):
                    raise AssertionError(f"definition {gen} ({arity} args) gave {got}")
                calls[0] += 1
        except BaseException:
            errors.append(traceback.format_exc())
            stop.set()

    threads = [threading.Thread(target=caller) for _ in range(3)]
    lib, cycles, end = None, 0, time.monotonic() + seconds
    with gate.redefine():
        lib = define(0, 1, "CPU")
    for t in threads:
        t.start()
    try:
        while time.monotonic() < end and not stop.is_set():
            gen = state[0] + 1
            arity = 1 if gen // 2 % 2 == 0 else 2  # same schema, then another, in turn
            with gate.redefine():
                lib._destroy()  # the previous definition's slot is still in its grace
                lib = define(gen, arity, "CPU" if gen % 3 else "CompositeExplicitAutograd")
                state[:] = [gen, arity]
            assert call(arity) == kernel_value(gen, arity)
            first = override(100000.0 + gen)
            assert call(arity) == 100000.0 + gen, (gen, call(arity))
            second = override(200000.0 + gen, priority=1)
            assert call(arity) == 200000.0 + gen
            first.remove()
            with pn.operations_disabled(f"{NS}::foo"):
                assert call(arity) == kernel_value(gen, arity)
            assert call(arity) == 200000.0 + gen
            second.remove()
            assert call(arity) == kernel_value(gen, arity)
            cycles += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
        lib._destroy()
    assert not errors, errors[:3]
    assert reclaim.settle(), reclaim.pending()
    assert torch._C._dispatch_dump(f"{NS}::foo") == "", torch._C._dispatch_dump(f"{NS}::foo")
    return cycles, calls[0]


for which in FRONTS:
    if which == "compiled":
        front.ensure_built()
    with front.serving(which):
        cycles, n = run(SECONDS)
    print(which, "cycles", cycles, "calls", n, flush=True)
"""


@pytest.mark.slow
def test_callers_see_only_the_current_definition_while_the_op_is_defined_again_and_overridden(tmp_path):
    fronts = ["python"] + ([] if compiled_front_problem() is not None else ["compiled"])
    script = tmp_path / "stress.py"
    script.write_text(_STRESS)
    proc = subprocess.run([sys.executable, str(script), "6", ",".join(fronts)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    for which in fronts:
        line = next(line for line in proc.stdout.splitlines() if line.startswith(f"{which} cycles"))
        cycles, calls = int(line.split()[2]), int(line.split()[4])
        assert cycles >= 10 and calls >= 100, line
