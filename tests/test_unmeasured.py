"""Ops no GPU has measured yet stay off at the CUDA key until a calibration table covers them."""

from __future__ import annotations

import json

import pytest

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from python_native import calibration, dsl_support, nvml
from python_native.core.registry import REGISTRY
from python_native_dsls.spec import OverrideSpec

GPU = "Fake GPU 80GB/sm99"


def _spec(op: str, measured: bool) -> OverrideSpec:
    return OverrideSpec(op, lambda *a, **k: False, lambda *a, **k: None, measured=measured)


@pytest.fixture
def recorded(monkeypatch):
    """Registrations recorded instead of made: ``[(dsl, op, key)]``."""
    calls: list[tuple[str, str, str]] = []
    monkeypatch.setattr(REGISTRY, "register", lambda dsl, ns, op, key, cond, impl, **o: calls.append((dsl, op, key)))
    monkeypatch.setattr(dsl_support, "_held_back", {})
    monkeypatch.delenv(calibration.ENV_VAR, raising=False)
    yield calls
    calibration.reset()


def _packaged_tables(monkeypatch, tmp_path, rows: list[dict], gpus: frozenset[str] | None) -> None:
    (tmp_path / calibration.table_filename(GPU)).write_text(json.dumps(
        {"format": calibration.FORMAT, "device": GPU, "rows": rows}))
    monkeypatch.setattr(calibration, "PACKAGED_DIR", tmp_path)
    monkeypatch.setattr(nvml, "device_keys", lambda: gpus)
    calibration.reset()


ROW = {"op": "native_dropout", "dtype": "float32", "bucket": 20, "wins": True}


def test_unmeasured_ops_stay_off_at_cuda_where_no_table_covers_them(recorded, monkeypatch, tmp_path):
    _packaged_tables(monkeypatch, tmp_path, [{**ROW, "op": "bmm"}], frozenset({GPU}))
    skipped: dict[str, str] = {}
    specs = [_spec("native_dropout", False), _spec("bmm", True)]
    dsl_support.register_specs("triton", "CUDA", specs, skipped)
    assert recorded == [("triton", "bmm", "CUDA")]
    assert set(skipped) == {"native_dropout"} and "not measured on this GPU" in skipped["native_dropout"]
    # Where the kernels run on CPU (the interpreter) the flag means nothing.
    recorded.clear()
    dsl_support.register_specs("triton", "CPU", specs)
    assert recorded == [("triton", "native_dropout", "CPU"), ("triton", "bmm", "CPU")]
    # A calibration run installs what was held back (once, however often it was left out), to measure it.
    dsl_support.register_specs("triton", "CUDA", specs)
    recorded.clear()
    dsl_support.install_unmeasured()
    assert recorded == [("triton", "native_dropout", "CUDA")]
    recorded.clear()
    dsl_support.install_unmeasured()
    assert recorded == []


@pytest.mark.parametrize("gpus,installed", [
    (frozenset({GPU}), True),                     # this GPU's table has rows for the op
    (frozenset({GPU, "Other GPU/sm80"}), False),  # a second model no table covers
    (None, False),                                # NVML cannot tell which GPU this is
])
def test_a_covering_table_installs_them(recorded, monkeypatch, tmp_path, gpus, installed):
    _packaged_tables(monkeypatch, tmp_path, [ROW], gpus)
    skipped: dict[str, str] = {}
    dsl_support.register_specs("triton", "CUDA", [_spec("native_dropout", False)], skipped)
    assert bool(recorded) == installed and bool(skipped) != installed


def test_a_named_table_covers_them_wherever_it_came_from(recorded, monkeypatch, tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"format": calibration.FORMAT, "device": "Another GPU/sm80", "rows": [ROW]}))
    monkeypatch.setenv(calibration.ENV_VAR, str(path))
    monkeypatch.setattr(nvml, "device_keys", lambda: None)
    dsl_support.register_specs("triton", "CUDA", [_spec("native_dropout", False), _spec("bmm", False)])
    assert recorded == [("triton", "native_dropout", "CUDA")]


def test_the_backend_reports_them_under_their_family(monkeypatch):
    from python_native_dsls.triton import ops

    ops.all_overrides()
    family = ops.FAMILY_OF["_softmax"]
    try:
        ops.note_left_out({"_softmax": "why"})
        assert ops.SKIPPED[family] == "_softmax: why"
    finally:
        ops.all_overrides()
