"""Ops no GPU has measured yet stay off at the CUDA key until a calibration source speaks for them."""

from __future__ import annotations

import pytest

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from calibration_testing import A100, H100, H100_PROPS, table

from python_native import dsl_support
from python_native.core.registry import REGISTRY
from python_native_dsls.spec import OverrideSpec

ROW = {"dsl": "triton", "op": "native_dropout", "dtype": "float32", "bucket": 20, "wins": True}


def _spec(op: str, measured: bool) -> OverrideSpec:
    return OverrideSpec(op, lambda *a, **k: False, lambda *a, **k: None, measured=measured)


SPECS = [_spec("native_dropout", False), _spec("bmm", True)]


@pytest.fixture
def recorded(monkeypatch, calib):
    """Registrations recorded instead of made: ``[(dsl, op, key)]``; calibration sources isolated."""
    calls: list[tuple[str, str, str]] = []
    monkeypatch.setattr(REGISTRY, "register", lambda dsl, ns, op, key, cond, impl, **o: calls.append((dsl, op, key)))
    monkeypatch.setattr(dsl_support, "_held_back", {})
    return calls


def test_unmeasured_ops_stay_off_at_cuda_where_nothing_speaks_for_them(recorded, calib):
    calib.gpus([H100])
    skipped: dict[str, str] = {}
    dsl_support.register_specs("triton", "CUDA", SPECS, skipped)
    assert recorded == [("triton", "bmm", "CUDA")]
    assert set(skipped) == {"native_dropout"} and "not measured on this GPU" in skipped["native_dropout"]
    assert H100.key in skipped["native_dropout"]
    # Where the kernels run on CPU (the interpreter) the flag means nothing.
    recorded.clear()
    dsl_support.register_specs("triton", "CPU", SPECS)
    assert recorded == [("triton", "native_dropout", "CPU"), ("triton", "bmm", "CPU")]
    # A calibration run installs what was held back (once, however often it was left out), to measure it.
    dsl_support.register_specs("triton", "CUDA", SPECS)
    recorded.clear()
    dsl_support.install_unmeasured()
    assert recorded == [("triton", "native_dropout", "CUDA")]
    recorded.clear()
    dsl_support.install_unmeasured()
    assert recorded == []


@pytest.mark.parametrize("gpus,evidence,installed", [
    ([H100], False, True),          # this GPU's table has rows for the op
    ([H100, A100], True, True),     # the A100: the portable policy, from the H100's measurement
    ([H100, A100], False, False),   # a table without device properties is no evidence: the A100 has none
    (None, True, True),             # NVML cannot tell: every table's device, and any GPU by the policy
    (None, False, False),
])
def test_a_source_speaking_for_them_installs_them(recorded, calib, gpus, evidence, installed):
    header = {"device_properties": H100_PROPS} if evidence else {}
    calib.ship(table(H100.key, [ROW], **header))
    calib.gpus(gpus)
    skipped: dict[str, str] = {}
    dsl_support.register_specs("triton", "CUDA", [_spec("native_dropout", False)], skipped)
    assert bool(recorded) == installed and bool(skipped) != installed


def test_a_named_table_and_calibration_off(recorded, calib, tmp_path):
    calib.gpus([A100])
    path = tmp_path / "mine.json"
    path.write_text(__import__("json").dumps(table(A100.key, [ROW])))
    calib.env(path)
    dsl_support.register_specs("triton", "CUDA", SPECS)
    assert recorded == [("triton", "native_dropout", "CUDA"), ("triton", "bmm", "CUDA")]
    recorded.clear()
    calib.env("off")  # no gate at all: the conds alone decide, unmeasured ops included
    dsl_support.register_specs("triton", "CUDA", SPECS)
    assert recorded == [("triton", "native_dropout", "CUDA"), ("triton", "bmm", "CUDA")]


def test_the_backend_reports_them_under_their_family():
    from python_native_dsls.triton import ops

    ops.all_overrides()
    family = ops.FAMILY_OF["native_dropout"]
    try:
        ops.note_left_out({"native_dropout": "why", "bernoulli_.float": "why too"})
        assert ops.SKIPPED[family] == "native_dropout: why; bernoulli_.float: why too"
    finally:
        ops.all_overrides()
