"""Fixtures: a test DSL overriding real aten ops at the CPU key, and clean state per test."""

from __future__ import annotations

import types

import pytest
import torch
from packaging.version import Version

import python_native as pn
from python_native.core.registry import REGISTRY

TEST_DSL = "testdsl"

if TEST_DSL not in pn.all_dsls:
    pn.register_dsl(
        TEST_DSL,
        types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("1.2.3")),
    )


@pytest.fixture
def overrides():
    """Register overrides through this list; each is removed and every switch reset afterwards."""
    handles: list = []

    def register(op: str, cond, impl, **kwargs):
        handle = pn.register_op_override(TEST_DSL, "aten", op, kwargs.pop("key", "CPU"), cond, impl, **kwargs)
        handles.append(handle)
        return handle

    yield register
    for handle in handles:
        handle.remove()
    REGISTRY.reset_switches()
    pn.reorder_overrides(None)


def always(*args, **kwargs) -> bool:
    return True


def marked_sub(self, other, alpha=1):
    """A sub that differs visibly from aten's (it adds 1000) and never calls aten::sub."""
    return torch.add(self, torch.neg(other) * alpha) + 1000


@pytest.fixture
def x():
    return torch.arange(6, dtype=torch.float32).reshape(2, 3)


@pytest.fixture
def calib(tmp_path, monkeypatch):
    """Isolated calibration sources (``calibration_testing.Sources``); everything restored afterwards."""
    from calibration_testing import Sources

    from python_native import calibration

    yield Sources(tmp_path, monkeypatch)
    calibration.set_device_key_fn(None)
    monkeypatch.undo()
    calibration.reset()
