"""Replay: a hit served by the compiled front from the launches recorded for its key.

On CPU the replayed launches go to the front's stand-in (``replay_testing``); everything else is
the real path: the dispatcher, the front's key, its records and their invalidation, the outputs it
allocates and the parameters it marshals. Each test runs under both fronts: with the Python routers
the same calls must give the same results, and nothing is replayed.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch
from replay_testing import (
    expected_sub,
    front_of,
    module,
    plain_sub,
    replayable_sub,
    replaying,
    stats,
    sub_cond,
    unlaunched_sub,
)

import python_native as pn
from conftest import TEST_DSL, always, compiled_front_problem, router_calls
from python_native.core import extensions
from python_native.core.registry import REGISTRY
from python_native.features import calibration
from python_native.features.front import replay
from python_native.foundations.launches import declare_replayable

pytestmark = [pytest.mark.both_fronts,
              pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem()))]


def ints(*shape: int) -> torch.Tensor:
    """Integer-valued floats: every path's arithmetic on them is exact."""
    return torch.randint(-50, 50, shape).float()


def _served_twice(fn) -> int:
    """Calls ``fn`` once to record, then counts the router's runs in a second call."""
    fn()
    return router_calls("sub.Tensor", fn)


def test_a_replayed_hit_never_enters_python(dispatch_front, overrides):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    x, y = ints(4, 8), ints(4, 8)
    with replaying():
        entered = _served_twice(lambda: torch.sub(x, y))
        out = torch.sub(x, y)
        torch.testing.assert_close(out, expected_sub(x, y), rtol=0, atol=0)
        assert out.shape == x.shape and out.stride() == x.stride() and out.dtype == x.dtype
        if dispatch_front == "compiled":
            assert entered == 0
            assert stats("sub.Tensor")["replayed"] == 2 and stats("sub.Tensor")["recorded"] == 1
            logged = module().replay_test_launches()
            assert len(logged) == 2 and logged[-1]["params"][:4] == [x.data_ptr(), y.data_ptr(), out.data_ptr(), 32]
        else:
            assert entered == 1


def test_the_key_tells_layouts_dtypes_alignment_and_scalars_apart(dispatch_front, overrides):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    base, other = ints(65), ints(65)
    calls = [
        lambda: torch.sub(base[:64], other[:64]),
        lambda: torch.sub(base[1:], other[1:]),  # pointers no longer 16-byte aligned
        lambda: torch.sub(base[:64], other[:64], alpha=2),  # a scalar argument
        lambda: torch.sub(base[:64].view(8, 8), other[:64].view(8, 8)),  # another shape
        lambda: torch.sub(base[:64].view(8, 8).t(), other[:64].view(8, 8).t()),  # strided: the cond declines
    ]
    a, b = base[:64], other[:64]
    expected = [expected_sub(a, b), expected_sub(base[1:], other[1:]), expected_sub(a, b, 2),
                expected_sub(a, b).view(8, 8), plain_sub(a.view(8, 8), b.view(8, 8)).t()]
    with replaying():
        for _ in range(3):
            for call, want in zip(calls, expected, strict=True):
                torch.testing.assert_close(call(), want, rtol=0, atol=0)
        if dispatch_front == "compiled":
            s = stats("sub.Tensor")
            assert s["records"] == 5 and s["recorded"] == 5  # four replayable keys and one declined
            assert s["replayed"] >= 8 and s["fallbacks"] >= 2
            kinds = sorted(r["kind"] for r in front_of("sub.Tensor").replay_records())
            assert kinds == ["fallback", "launches", "launches", "launches", "launches"]


def test_a_declined_key_is_served_by_the_kernel_below_without_python(dispatch_front, overrides):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    x, y = ints(3, 5).double(), ints(3, 5).double()  # float64: the cond declines
    with replaying():
        entered = _served_twice(lambda: torch.sub(x, y))
        torch.testing.assert_close(torch.sub(x, y), plain_sub(x, y), rtol=0, atol=0)
        assert entered == (0 if dispatch_front == "compiled" else 1)


def test_a_call_that_cannot_be_replayed_keeps_the_python_path(dispatch_front, overrides):
    overrides("sub.Tensor", always, unlaunched_sub)
    x, y = ints(4, 4), ints(4, 4)
    with replaying():
        entered = _served_twice(lambda: torch.sub(x, y))
        torch.testing.assert_close(torch.sub(x, y), expected_sub(x, y), rtol=0, atol=0)
        assert entered == 1
        if dispatch_front == "compiled":
            (record,) = front_of("sub.Tensor").replay_records()
            assert record["kind"] == "python" and "no launch" in record["why"]
            assert stats("sub.Tensor")["to_python"] >= 2


def test_an_override_that_is_not_replayable_keeps_the_slot_in_python(dispatch_front, overrides):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    overrides("sub.Tensor", lambda *a, **k: False, lambda self, other, alpha=1: self, priority=5)  # undeclared
    x, y = ints(4, 4), ints(4, 4)
    with replaying():
        assert _served_twice(lambda: torch.sub(x, y)) == 1
        torch.testing.assert_close(torch.sub(x, y), expected_sub(x, y), rtol=0, atol=0)


def test_checked_mode_never_replays(dispatch_front, overrides, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    h = overrides("sub.Tensor", sub_cond, replayable_sub)
    assert extensions.sees_every_call(h.routed_impl)
    x, y = ints(4, 4), ints(4, 4)
    with replaying():
        for _ in range(3):  # checked on every call: the +1000 differs from aten's answer each time
            with pytest.raises(pn.OverrideMismatch):
                torch.sub(x, y)


def _recorded_again(x, y) -> bool:
    """Whether the next call of ``sub(x, y)`` entered Python (its record was cleared)."""
    return router_calls("sub.Tensor", lambda: torch.sub(x, y)) == 1


@pytest.mark.parametrize("change", ["toggle", "variant", "trace", "calibration", "registration"])
def test_every_change_that_could_change_the_answer_clears_the_records(dispatch_front, overrides, change):
    if dispatch_front != "compiled":
        pytest.skip("records belong to the compiled front")
    overrides("sub.Tensor", sub_cond, replayable_sub,
              variants={"other": declare_replayable(lambda self, other, alpha=1: replayable_sub(self, other, alpha))})
    x, y = ints(4, 4), ints(4, 4)
    with replaying():
        torch.sub(x, y)
        assert not _recorded_again(x, y)  # replayed
        if change == "toggle":
            with pn.operations_disabled("sub"):
                torch.testing.assert_close(torch.sub(x, y), plain_sub(x, y))
        elif change == "variant":
            pn.set_override_variant("sub.Tensor", "other")
        elif change == "trace":
            with pn.trace() as t:
                assert _recorded_again(x, y)
            assert [e.outcome for e in t.events] == ["override"]
        elif change == "calibration":
            calibration.reset()
        else:
            overrides("sub.Tensor", lambda *a, **k: False, replayable_sub, priority=-1)
        assert _recorded_again(x, y)
        assert not _recorded_again(x, y)  # recorded again, then replayed
        torch.testing.assert_close(torch.sub(x, y), expected_sub(x, y), rtol=0, atol=0)


def test_a_removed_override_is_never_replayed(dispatch_front, overrides):
    h = pn.register_op_override(TEST_DSL, "aten", "sub.Tensor", "CPU", sub_cond, replayable_sub)
    x, y = ints(4, 4), ints(4, 4)
    try:
        with replaying():
            torch.sub(x, y)
            torch.testing.assert_close(torch.sub(x, y), expected_sub(x, y), rtol=0, atol=0)
            h.remove()
            torch.testing.assert_close(torch.sub(x, y), plain_sub(x, y), rtol=0, atol=0)
    finally:
        h.remove()
    assert REGISTRY.settle()


def test_records_are_bounded_per_slot(dispatch_front, overrides, monkeypatch):
    if dispatch_front != "compiled":
        pytest.skip("records belong to the compiled front")
    monkeypatch.setattr(replay.STATE, "capacity", 4)
    overrides("sub.Tensor", sub_cond, replayable_sub)
    assert front_of("sub.Tensor").replay_capacity == 4
    with replaying():
        for n in range(1, 41):
            x, y = ints(n), ints(n)
            torch.sub(x, y)
            torch.testing.assert_close(torch.sub(x, y), expected_sub(x, y), rtol=0, atol=0)  # the newest replays
            assert stats("sub.Tensor")["records"] <= 4
        s = stats("sub.Tensor")
        assert s["records"] == 4 and s["recorded"] == 40 and s["replayed"] == 40
        assert router_calls("sub.Tensor", lambda: torch.sub(ints(1), ints(1))) == 1  # the oldest was let go


def test_callers_toggles_and_removal_on_other_threads(dispatch_front, overrides):
    """Callers check every result while the main thread toggles, re-registers and removes."""
    inputs = [(ints(8, 16 + i), ints(8, 16 + i)) for i in range(4)]
    errors: list[BaseException] = []
    stop = threading.Event()
    served = [0] * len(inputs)

    def call(i: int) -> None:
        x, y = inputs[i]
        plain, marked = plain_sub(x, y), expected_sub(x, y)
        try:
            while not stop.is_set():
                out = torch.sub(x, y)
                assert torch.equal(out, marked) or torch.equal(out, plain), "a result of neither path"
                served[i] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with replaying():
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 60
            for round_ in itertools.count():  # at least 12 rounds, and until every caller was served often
                if round_ >= 12 and min(served) >= 20 or time.monotonic() > deadline:
                    break
                h = pn.register_op_override(TEST_DSL, "aten", "sub.Tensor", "CPU", sub_cond, replayable_sub)
                time.sleep(0.005)  # replayed calls while it stands
                for _ in range(3):
                    with pn.operations_disabled("sub"):
                        pass
                if round_ % 3 == 0:
                    with pn.trace():
                        pass
                h.remove()
        finally:
            stop.set()
            for t in threads:
                t.join()
        replayed = len(module().replay_test_launches())
    assert not errors, errors[:3]
    assert replayed > 0 if dispatch_front == "compiled" else replayed == 0
    assert all(served)
    assert REGISTRY.settle()
    for x, y in inputs:  # all removed: aten's answer
        torch.testing.assert_close(torch.sub(x, y), plain_sub(x, y), rtol=0, atol=0)


def test_the_status_report_says_whether_replay_is_on_and_why(dispatch_front, overrides):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    info = pn.status()["front"]["replay"]
    assert set(info) >= {"on", "why"}
    with replaying():
        info = pn.status()["front"]["replay"]
        if dispatch_front == "compiled":
            assert info["on"] and info["why"] == "forced on"
            assert info["slots"]["aten::sub.Tensor @ CPU"]["replaying"]
        else:
            assert not info["on"]
