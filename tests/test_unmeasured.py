"""Overrides no GPU has timed yet stay off at GPU keys until a calibration table has rows for them,
and the status report says why."""

from __future__ import annotations

import json

import pytest

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from python_native import calibration, dsl_support, env, nvml, report
from python_native.core.registry import REGISTRY
from python_native_dsls.spec import OverrideSpec
from python_native_dsls.triton.ops import SKIPPED, reductions

GPU = "Fake GPU 80GB/sm99"


def _table(tmp_path, rows: list[dict], device: str = GPU, name: str = "table.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"format": calibration.FORMAT, "device": device, "rows": rows}))
    return path


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No opt-in, no tables (an empty folder), a machine of one fake GPU model."""
    monkeypatch.delenv(env.UNMEASURED[0], raising=False)
    monkeypatch.setenv(calibration.ENV_VAR, str(tmp_path))
    monkeypatch.setattr(nvml, "device_keys", lambda: frozenset({GPU}))
    calibration.reset()
    yield
    calibration.reset()


def test_unmeasured_ops_stay_off_gpus_without_evidence(clean, monkeypatch, tmp_path):
    why = dsl_support.unmeasured_reason("amax", "triton", "CUDA")
    assert why is not None and "PYTHON_NATIVE_UNMEASURED=1" in why and "calibration table" in why
    assert dsl_support.unmeasured_reason("amax", "triton", "CPU") is None  # the interpreter: speed is no question
    monkeypatch.setenv(env.UNMEASURED[0], "1")
    assert dsl_support.unmeasured_reason("amax", "triton", "CUDA") is None


def test_a_table_with_rows_for_the_op_is_evidence(clean, monkeypatch, tmp_path):
    _table(tmp_path, [{"op": "amax", "dtype": "bfloat16", "bucket": 20, "wins": True, "dsl": "triton"}])
    calibration.reset()
    assert dsl_support.unmeasured_reason("amax", "triton", "CUDA") is None
    assert dsl_support.unmeasured_reason("amin", "triton", "CUDA") is not None  # rows for another op only
    assert dsl_support.unmeasured_reason("amax", "cutedsl", "CUDA") is not None  # rows of another DSL only


@pytest.mark.parametrize("machine, evidence", [
    (frozenset({GPU}), True), (frozenset({"Other GPU/sm80"}), False), (frozenset({GPU, "Other GPU/sm80"}), False),
    (None, False),
])
def test_packaged_tables_are_evidence_for_the_models_they_cover(monkeypatch, tmp_path, machine, evidence):
    _table(tmp_path, [{"op": "amax", "dtype": "float32", "bucket": 9, "wins": False}], name="fake_gpu_80gb_sm99.json")
    monkeypatch.delenv(calibration.ENV_VAR, raising=False)
    monkeypatch.delenv(env.UNMEASURED[0], raising=False)
    monkeypatch.setattr(calibration, "PACKAGED_DIR", tmp_path)
    monkeypatch.setattr(nvml, "device_keys", lambda: machine)
    calibration.reset()
    try:
        assert calibration.has_evidence("amax", "triton") is evidence
    finally:
        calibration.reset()


def test_registration_leaves_them_out_and_says_why(clean, monkeypatch):
    registered: list[str] = []
    monkeypatch.setattr(REGISTRY, "register", lambda dsl, lib, op, key, cond, impl, **options: registered.append(op))
    measured = OverrideSpec("silu", lambda x: True, lambda x: x)
    skipped: dict[str, str] = {}
    dsl_support.register_specs("triton", "CUDA", [measured, *reductions.OVERRIDES], skipped)
    assert registered == ["silu"]
    assert set(skipped) == {spec.op for spec in reductions.OVERRIDES}
    assert all(not spec.measured and "not yet timed" in skipped[spec.op] for spec in reductions.OVERRIDES)
    registered.clear()
    dsl_support.register_specs("triton", "CPU", reductions.OVERRIDES, {})
    assert registered == [spec.op for spec in reductions.OVERRIDES]


def test_status_lists_the_reason(clean, monkeypatch):
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
