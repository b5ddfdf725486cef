"""The CuTe DSL impls load and launch their programs on their inputs' device, not the current one.

Without a GPU the device is faked: a tensor-like whose device is ``cuda:1``, a current device of 0
(the query the guard asks), ``torch.cuda.device`` recording what it enters, and a compiler whose
programs record the device current when they load and run. No cutlass is needed.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

import python_native as pn  # noqa: F401  (first: mounts the control plane and registers the DSLs)

# isort: split
from python_native_dsls.cutedsl.ops import _rows


@pytest.fixture
def faked(monkeypatch):
    """``(current device cell, what ran where)`` with the compiler and device queries faked."""
    current, ran = [0], []

    @contextlib.contextmanager
    def device(index):
        before, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = before

    def function(specialization, arch):
        ran.append(("load", current[0]))
        return lambda *args: ran.append(("launch", current[0]))

    monkeypatch.setattr(_rows, "current_device", lambda: current[0], raising=False)
    monkeypatch.setattr(_rows.torch.cuda, "device", device)
    monkeypatch.setattr(_rows, "compiler", lambda: types.SimpleNamespace(function=function))
    monkeypatch.setattr(_rows, "arch", lambda t: "sm_90a")
    monkeypatch.setattr(_rows, "_launchers", {})
    return current, ran


def _on(index: int):
    return types.SimpleNamespace(device=torch.device("cuda", index))


def test_a_program_loads_and_launches_on_its_tensors_device(faked):
    current, ran = faked
    run = _rows.launcher("softmax_forward", torch.float32, torch.float32, 100, _on(1))
    run("x", "y")
    assert ran == [("load", 1), ("launch", 1)] and current == [0]  # the current device is back


def test_the_guard_is_not_entered_on_the_current_device(faked, monkeypatch):
    current, ran = faked
    monkeypatch.setattr(_rows.torch.cuda, "device", lambda index: pytest.fail("entered the current device"))
    _rows.launcher("softmax_forward", torch.float32, torch.float32, 100, _on(0))("x")
    assert ran == [("load", 0), ("launch", 0)]


def test_each_device_has_its_own_program(faked):
    _, ran = faked
    first = _rows.launcher("row_reduce", torch.float32, torch.float32, 64, _on(1), "sum")
    again = _rows.launcher("row_reduce", torch.float32, torch.float32, 64, _on(1), "sum")
    other = _rows.launcher("row_reduce", torch.float32, torch.float32, 64, _on(0), "sum")
    assert first is again and other is not first and [r for r in ran if r[0] == "load"] == [("load", 1), ("load", 0)]
