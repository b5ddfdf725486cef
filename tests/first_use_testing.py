"""Shared pieces of the first-use tests: a fake GPU for CPU tensors, a faked clock, pn.benchmark on."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from calibration_testing import FAKE_DEVICE, FAKE_GPU

import python_native_dsls.triton as triton_backend
from python_native.features import calibration
from python_native.features.calibration import measure

# Tests that time the Triton kernels behind the CPU key as a fake GPU's need them there: under
# Triton's interpreter. Where they run on a real GPU (the CUDA key), nothing serves the CPU key, and
# the real GPU the fake one stands for is tested as itself.
TRITON_AT_CPU = triton_backend.dispatch_key() == "CPU"
NOT_AT_CPU = ("the Triton kernels serve a real GPU here (the CUDA key), not the CPU key this test dresses "
              "up as a fake GPU")


class FakeClock:
    """Times a cell as ``timings(numel) -> (override ms, aten ms)`` says; runs both sides once, as the
    real clock does at least, and counts the cells it was asked about."""

    def __init__(self, timings: Callable[[int], tuple[float, float]] = lambda n: (1.0, 2.0), pause: float = 0.0):
        self.timings, self.pause = timings, pause
        self.asked: list[tuple[int, ...]] = []
        self.lock = threading.Lock()

    def __call__(self, ours, aten, t) -> tuple[float, float]:
        with self.lock:
            self.asked.append(tuple(t.shape))
        ours()
        aten()
        time.sleep(self.pause)  # others meet the cell while it is being measured
        return self.timings(t.numel())


class Bench:
    """pn.benchmark on a fake GPU: CPU tensors report ``FAKE_DEVICE``, NVML lists it, the clock is faked."""

    def __init__(self, calib, monkeypatch: pytest.MonkeyPatch):
        self.calib, self.monkeypatch = calib, monkeypatch
        calib.gpus([FAKE_GPU])
        calib.device(FAKE_DEVICE)
        self.clock = FakeClock()
        measure.set_timer(self.clock)
        calibration.set_benchmark(True)

    @property
    def user_dir(self) -> Path:
        return self.calib.user_dir

    def user_rows(self) -> list[dict]:
        """Every row of every table in the user's folder."""
        return [row for path in sorted(self.user_dir.glob("*.json")) for row in calibration.load(path)["rows"]]

    def close(self) -> None:
        measure.set_timer(None)
        calibration.set_benchmark(False)


def sub_of(x: torch.Tensor) -> torch.Tensor:
    return torch.sub(x, x)


def overridden(x: torch.Tensor) -> torch.Tensor:
    """What conftest's ``marked_sub`` answers for ``x - x``."""
    return torch.full_like(x, 1000.0)


@contextlib.contextmanager
def patching_on_a_fake_gpu(calib, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    """The CPU key's overrides serve a fake GPU (CPU tensors report its device key), timed by a fake
    clock, with what ``pn.patch`` asks to measure forgotten before and after, and ``pn.benchmark``
    as a fresh process has it. Yields the clock."""
    from python_native.features.calibration import first_use

    monkeypatch.setattr(first_use, "_requested", set())
    monkeypatch.setattr(first_use, "_refused", False)
    calib.gpus([FAKE_GPU])
    calib.device(FAKE_DEVICE)
    clock = FakeClock()
    measure.set_timer(clock)
    try:
        yield clock
    finally:
        measure.set_timer(None)
        monkeypatch.undo()
        calibration.reset()
        calibration.set_benchmark(False)
        first_use.set_refused(False)
