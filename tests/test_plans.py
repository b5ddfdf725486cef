"""``impl_takes_plan``: a cond's result reaches its impl as ``plan``, through every path a call takes."""

from __future__ import annotations

import json
import types

import pytest
import torch

import python_native as pn
from conftest import marked_sub
from python_native.core.registry import REGISTRY
from python_native.features import calibration


class Plan:
    """A stand-in for a launch plan: truthy, and counting how often conds build one."""

    built = 0

    def __init__(self, rows: int):
        Plan.built += 1
        self.rows = rows


def planning_cond(self, other, alpha):
    return Plan(self.shape[0]) if self.dim() == 2 else None


def test_impl_receives_the_plan_its_cond_returned(overrides, x):
    received = []

    def impl(self, other, alpha, plan=None):
        received.append(plan)
        return marked_sub(self, other, alpha)

    overrides("sub.Tensor", planning_cond, impl, impl_takes_plan=True)
    Plan.built = 0
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    assert Plan.built == 1 and len(received) == 1 and received[0].rows == 2  # the cond planned once
    v = torch.ones(3)
    assert torch.equal(torch.sub(v, v), torch.zeros(3))  # None: declined, aten's kernel
    assert len(received) == 1
    assert "plan=_pn_plan" in pn.router_source("sub.Tensor", "CPU")


@pytest.mark.parametrize("declined", [None, False, 0, ()])
def test_any_falsy_result_declines(overrides, x, declined):
    overrides("sub.Tensor", lambda s, o, alpha: declined, lambda s, o, alpha, plan=None: marked_sub(s, o, alpha),
              impl_takes_plan=True)
    assert torch.equal(torch.sub(x, x), torch.zeros_like(x))


def test_plans_reach_derived_forms(overrides, x):
    received = []

    def impl(self, other, alpha, plan=None):
        received.append(plan.rows)
        return marked_sub(self, other, alpha)

    overrides("sub.Tensor", planning_cond, impl, impl_takes_plan=True, derive_forms=True)
    y = x.clone()
    y.sub_(x)
    out = torch.empty_like(x)
    torch.sub(x, x, out=out)
    assert torch.equal(y, torch.full_like(x, 1000)) and torch.equal(out, y)
    assert received == [2, 2]


def test_bad_settings_are_named(overrides):
    with pytest.raises(TypeError, match="impl_takes_plan must be a bool, got str"):
        overrides("sub.Tensor", planning_cond, marked_sub, impl_takes_plan="yes")
    with pytest.raises(ValueError, match="impl_takes_plan=True needs a cond"):
        overrides("sub.Tensor", None, marked_sub, unconditional_override=True, impl_takes_plan=True)
    assert not [o for o in pn.overrides() if o.dsl == "testdsl"]  # nothing half-registered


def test_checked_mode_keeps_the_plan_from_aten(overrides, monkeypatch, x):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    received = []

    def impl(self, other, alpha, plan=None):
        received.append(plan)
        return torch.add(self, other, alpha=-alpha)

    overrides("sub.Tensor", planning_cond, impl, impl_takes_plan=True)
    y = torch.randn(2, 3)
    assert torch.allclose(torch.sub(x, y), x - y)  # compared with aten's kernel, which gets no plan
    assert isinstance(received[0], Plan)


def test_removed_override_in_flight_drops_its_plan(overrides, x):
    handle = overrides("sub.Tensor", planning_cond, lambda s, o, alpha, plan=None: marked_sub(s, o, alpha),
                       impl_takes_plan=True)
    namespace, uid = handle._slot.namespace, handle.uid

    def remove_then_look_up(handle, uid):
        handle.remove()
        return globals()[f"_pn_impl_{uid}"]

    # A call inside the router (a frame whose globals are the slot's namespace) when the override
    # went finds its tombstone impl, plan and all.
    inside_router = types.FunctionType(remove_then_look_up.__code__, namespace)
    again = inside_router(handle, uid)
    assert torch.equal(again(x, x, alpha=1, plan=Plan(2)), torch.zeros_like(x))


def test_calibration_gate_passes_the_plan_through(tmp_path, monkeypatch):
    rows = [
        {"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": True},
        {"op": "_softmax", "dtype": "float32", "bucket": 11, "wins": False},
    ]
    content = {"format": calibration.FORMAT, "device": "Fake GPU/sm99", "torch": "x", "triton": "y", "date": "d",
               "kernels": calibration.versions.table_entry([("triton", "_softmax")]), "rows": rows}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(content))
    monkeypatch.setenv(calibration.ENV_VAR, str(path))
    calibration.reset()
    calibration.set_device_key_fn(lambda device: "Fake GPU/sm99")
    try:
        gate = calibration.gated("_softmax", lambda x, dim, half_to_float: Plan(x.shape[0]))
        plan = gate(torch.randn(4, 64), -1, False)  # bucket 9: wins, the cond's own plan comes back
        assert isinstance(plan, Plan) and plan.rows == 4
        assert gate(torch.randn(16, 64), -1, False) is False  # bucket 11: declined before the cond
    finally:
        calibration.set_device_key_fn(None)
        calibration.reset()


def test_triton_library_plans_in_its_conds():
    planned = {o.op for o in REGISTRY.overrides() if o.dsl == "triton" and o.takes_plan}
    installed = {o.op for o in REGISTRY.overrides() if o.dsl == "triton"}
    assert {"_softmax", "_log_softmax", "native_layer_norm", "bmm"} <= planned <= installed
