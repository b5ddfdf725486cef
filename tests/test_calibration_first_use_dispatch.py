"""``pn.benchmark`` where calls meet it: threads at one new size, graph capture and compile
tracing (nothing measured), the compiled front's masks, op families no GPU has timed."""

from __future__ import annotations

import threading

import pytest
import torch

import python_native as pn

# isort: split
from calibration_testing import FAKE_DEVICE, H100
from first_use_testing import overridden, sub_of

from conftest import always, compiled_front_problem, router_calls
from python_native.features import calibration, front
from python_native.panel import dsl_support


def exact_neg(x: torch.Tensor) -> torch.Tensor:
    """The override's answer, which aten's matches bit for bit: whoever answers, the result is the same."""
    return x * -1


def test_eight_threads_at_one_new_size_measure_it_once(bench, overrides):
    bench.clock.pause = 0.3  # the others arrive while the first measures
    calls = []
    lock = threading.Lock()

    def impl(x):
        with lock:
            calls.append(threading.get_ident())
        return exact_neg(x)

    overrides("neg", always, impl)
    x = torch.randn(16, 64)
    start, errors, done = threading.Barrier(8), [], []

    def worker():
        try:
            start.wait()
            for _ in range(5):
                result = torch.neg(x)
                if not torch.equal(result, -x):
                    raise AssertionError(f"wrong result in thread {threading.get_ident()}")
            done.append(1)
        except BaseException as e:  # noqa: BLE001  (reported below, per thread)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(done) == 8
    assert bench.clock.asked == [(16, 64)]  # measured once, by one thread
    before = len(calls)
    torch.neg(x)
    assert len(calls) == before + 1  # the verdict (the override is faster) holds for everyone now
    assert [r["bucket"] for r in bench.user_rows()] == [11]


@pytest.mark.parametrize("where", ["capturing", "compiling"])
def test_nothing_is_measured_inside_a_graph_capture_or_a_compile_trace(bench, overrides, monkeypatch, where):
    """There the verdict that stood answers (aten, where nothing speaks); the size is measured at
    its first call outside."""
    overrides("sub.Tensor", always, lambda self, other, alpha=1: torch.add(self, torch.neg(other) * alpha) + 1000)
    x = torch.ones(4, 64)
    with monkeypatch.context() as inside:
        if where == "capturing":  # what torch answers while a CUDA stream captures
            inside.setattr(torch.cuda, "is_initialized", lambda: True)
            inside.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        else:
            inside.setattr(torch.compiler, "is_compiling", lambda: True)
        assert torch.equal(sub_of(x), torch.zeros_like(x))
    assert bench.clock.asked == []
    assert torch.equal(sub_of(x), overridden(x)) and bench.clock.asked == [(4, 64)]


@pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem()))
def test_the_compiled_front_declines_in_cpp_what_a_first_use_found_slower(bench, overrides):
    bench.clock.timings = lambda n: (2.0, 1.0)  # aten is faster
    with front.serving("compiled"):
        handle = overrides("sub.Tensor", always, lambda self, other, alpha=1: torch.add(self, other, alpha=-alpha) + 1000)
        slot = handle.slot
        x, other = torch.ones(4, 64), torch.ones(16, 64)
        assert front.describe()["slots"][slot.label] == "python"  # nothing known: every call to Python
        assert router_calls(slot, lambda: sub_of(x)) == 1  # measured there: aten is faster
        assert front.describe()["slots"][slot.label] == "gated"
        assert router_calls(slot, lambda: sub_of(x)) == 0  # declined in C++ from now on
        assert torch.equal(sub_of(x), torch.zeros_like(x))
        assert router_calls(slot, lambda: sub_of(other)) == 1  # another size: still to measure
        assert bench.clock.asked == [(4, 64), (16, 64)]


def test_op_families_no_gpu_timed_are_installed_where_pn_benchmark_will_time_them(bench, monkeypatch):
    """At a GPU key an unmeasured override waits for evidence; pn.benchmark is evidence to come."""
    monkeypatch.delenv("PYTHON_NATIVE_UNMEASURED", raising=False)
    bench.calib.gpus([H100])
    assert dsl_support.unmeasured_reason("amax", "triton", "CUDA") is None
    assert calibration.never_wins("amax", dispatch_key="CUDA") is False
    calibration.set_benchmark(False)
    assert "not yet timed" in dsl_support.unmeasured_reason("amax", "triton", "CUDA")


def test_cells_to_measure_are_never_masked_and_a_measured_loss_is(bench, overrides):
    """A front sends the calls of a cell to measure to Python; a loss found there it declines."""
    bench.clock.timings = lambda n: (2.0, 1.0)
    handle = overrides("sub.Tensor", always, lambda self, other, alpha=1: torch.add(self, other, alpha=-alpha))
    gate = calibration.gate_of(handle.routed_cond)
    masks = gate.decline_masks(FAKE_DEVICE)
    assert masks and all(pair == (0, 0) for pair in masks.values())  # every cell is still to measure
    sub_of(torch.ones(4, 64))
    assert gate.decline_masks(FAKE_DEVICE)["float32"] == (1 << 9, 0)
    with pn.benchmark_set(False):  # after: the loss holds, and what nothing measured declines
        assert gate.decline_masks(FAKE_DEVICE)["float32"] == (2**64 - 1, 2**64 - 1)


def test_switching_pn_benchmark_gates_the_installed_overrides_and_off_ungates_them(bench, overrides):
    """Set at run time, as cudnn.benchmark is: an override nothing spoke for at its registration is
    gated then, and measured; switched off, a gate nothing speaks for any more is taken off again."""
    calibration.set_benchmark(False)
    plain = overrides("sub.Tensor", always, lambda self, other, alpha=1: torch.add(self, other, alpha=-alpha) + 1000)
    other = overrides("mul.Tensor", always, lambda self, other: torch.ones_like(self))
    assert calibration.gate_of(plain.routed_cond) is None and calibration.gate_of(other.routed_cond) is None
    pn.benchmark = True
    assert calibration.gate_of(plain.routed_cond) is not None
    x = torch.ones(4, 64)
    assert torch.equal(sub_of(x), overridden(x)) and bench.clock.asked == [(4, 64)]
    pn.benchmark = False
    assert calibration.gate_of(plain.routed_cond) is not None  # its verdict speaks for it now
    assert calibration.gate_of(other.routed_cond) is None  # never measured: back to its plain cond
    assert torch.equal(torch.mul(x, x), x)
