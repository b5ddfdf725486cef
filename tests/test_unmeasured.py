"""Overrides no GPU has timed yet stay off at GPU keys until a calibration source speaks for them,
and the status report says why."""

from __future__ import annotations

import pytest

import python_native as pn

# isort: split
from calibration_testing import H100, H100_PROPS, H200, rows_winning_from, table

from python_native.core.registry import REGISTRY
from python_native.features import calibration
from python_native.foundations import env
from python_native.panel import dsl_support
from python_native.tools import report
from python_native_dsls.spec import OverrideSpec
from python_native_dsls.triton.ops import SKIPPED, reductions


@pytest.fixture
def clean(calib, monkeypatch):
    """No opt-in, no table anywhere, a machine of H100s."""
    monkeypatch.delenv(env.UNMEASURED[0], raising=False)
    calib.gpus([H100])
    return calib


def test_unmeasured_ops_stay_off_gpus_without_evidence(clean, monkeypatch):
    why = dsl_support.unmeasured_reason("amax", "triton", "CUDA")
    assert why is not None and "PYTHON_NATIVE_UNMEASURED=1" in why and "calibration table" in why
    assert dsl_support.unmeasured_reason("amax", "triton", "CPU") is None  # the interpreter: speed is no question
    monkeypatch.setenv(env.UNMEASURED[0], "1")
    assert dsl_support.unmeasured_reason("amax", "triton", "CUDA") is None


def test_a_table_with_rows_for_the_op_is_evidence(clean):
    clean.ship(table(H100.key, rows_winning_from("amax", "bfloat16", {0: 20, 1: 20})))
    assert dsl_support.unmeasured_reason("amax", "triton", "CUDA") is None
    assert dsl_support.unmeasured_reason("amin", "triton", "CUDA") is not None  # rows for another op only
    assert dsl_support.unmeasured_reason("amax", "cutedsl", "CUDA") is not None  # rows of another DSL only
    clean.gpus([H100, H200])  # an H200 beside it: the H100's table does not speak for the H200
    assert not calibration.has_evidence("amax", "triton", "CUDA")
    clean.gpus(None)  # NVML cannot tell: any GPU may serve
    assert not calibration.has_evidence("amax", "triton", "CUDA")


def test_the_portable_policy_carries_a_shipped_table_to_other_gpus(clean):
    clean.ship(table("Reference GPU/sm90", rows_winning_from("amax", "float32", {0: 18, 1: 18}),
                     device_properties=H100_PROPS))
    clean.gpus([H200])
    assert calibration.has_evidence("amax", "triton", "CUDA")
    assert not calibration.has_evidence("argmax", "triton", "CUDA")


def test_registration_leaves_them_out_and_says_why(clean, monkeypatch):
    registered: list[str] = []
    monkeypatch.setattr(REGISTRY, "register", lambda dsl, lib, op, key, cond, impl, **options: registered.append(op))
    measured = OverrideSpec("silu", lambda x: True, lambda x: x)
    skipped: dict[str, str] = {}
    dsl_support.register_specs("triton", "CUDA", [measured, *reductions.FAMILY.specs], skipped)
    assert registered == ["silu"]
    assert set(skipped) == {spec.op for spec in reductions.FAMILY.specs}
    assert all(not spec.measured and "not yet timed" in skipped[spec.op] for spec in reductions.FAMILY.specs)
    registered.clear()
    dsl_support.register_specs("triton", "CPU", reductions.FAMILY.specs, {})
    assert registered == [spec.op for spec in reductions.FAMILY.specs]


def test_every_unmeasured_op_of_every_family_stays_off_gpus(clean, monkeypatch):
    """Every op a family declares ``measured=False`` (the ops model patching routes to, ``python_native::*``,
    among them): no GPU has timed their kernels against aten or the ops' references yet."""
    from python_native_dsls.triton import ops

    specs = [s for f in ops.families() for s in f.specs if not s.measured]
    assert {"rms_norm", "swiglu", "rotary", "moe_experts"} <= {s.op for s in specs if s.lib == "python_native"}
    registered: list[str] = []
    monkeypatch.setattr(REGISTRY, "register", lambda dsl, lib, op, key, cond, impl, **options: registered.append(op))
    skipped: dict[str, str] = {}
    dsl_support.register_specs("triton", "CUDA", specs, skipped)
    assert registered == [] and set(skipped) == {s.op for s in specs}


def test_status_lists_the_reason(clean):
    saved = dict(SKIPPED)
    SKIPPED["amax"] = dsl_support.unmeasured_reason("amax", "triton", "CUDA")
    try:
        data = pn.status()
        triton = next(d for d in data["dsls"] if d["name"] == "triton")
        assert "not yet timed" in triton["skipped"]["amax"]
        assert "not installed: amax (not yet timed" in report.render(data)
    finally:
        SKIPPED.clear()
        SKIPPED.update(saved)
