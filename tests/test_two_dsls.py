"""Two DSLs overriding one op: priority, then the calibration table, pick who serves each call."""

from __future__ import annotations

import json
import types

import pytest
import torch
from packaging.version import Version

import python_native as pn
from python_native.core import extensions
from python_native.core.registry import REGISTRY
from python_native.features import calibration
from python_native.tools import report

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts

FAST, SLOW = "twin_fast", "twin_slow"  # FAST is calibrated faster than SLOW where both beat aten
MARK = {FAST: 1000.0, SLOW: 2000.0}

for _name in (SLOW, FAST):
    if _name not in pn.all_dsls:
        pn.register_dsl(_name, types.SimpleNamespace(runtime_available=lambda: True,
                                                     runtime_version=lambda: Version("1.0")))

SMALL = torch.arange(6, dtype=torch.float32)  # bucket 3: both DSLs beat aten, FAST by more
LARGE = torch.ones(1024, dtype=torch.float32)  # bucket 11: both lose to aten
MIDDLE = torch.ones(64, dtype=torch.float32)  # bucket 7: only SLOW was measured faster than aten

ROWS = [
    {"dsl": SLOW, "op": "sub", "dtype": "float32", "bucket": 3, "wins": True, "speedup": 1.3},
    {"dsl": FAST, "op": "sub", "dtype": "float32", "bucket": 3, "wins": True, "speedup": 1.9},
    {"dsl": SLOW, "op": "sub", "dtype": "float32", "bucket": 7, "wins": True, "speedup": 1.2},
    {"dsl": FAST, "op": "sub", "dtype": "float32", "bucket": 7, "wins": False, "speedup": 0.8},
    {"dsl": SLOW, "op": "sub", "dtype": "float32", "bucket": 11, "wins": False, "speedup": 0.7},
    {"dsl": FAST, "op": "sub", "dtype": "float32", "bucket": 11, "wins": False, "speedup": 0.9},
]


def marking(dsl: str):
    def impl(self, other, alpha=1):
        return torch.add(self, torch.neg(other) * alpha) + MARK[dsl]

    impl.__name__ = f"{dsl}_sub"
    return impl


ACCEPTS = {SLOW: True, FAST: True}  # what each DSL's own cond answers


def own_cond(dsl: str):
    def cond(*args, **kwargs) -> bool:
        return ACCEPTS[dsl]

    return cond


@pytest.fixture
def twins(tmp_path, monkeypatch):
    """A calibration table for the CPU device key, then both DSLs' gated subs at the CPU key (SLOW first)."""
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"format": calibration.FORMAT, "device": "cpu", "rows": ROWS}))
    monkeypatch.setenv(calibration.ENV_VAR, str(path))
    calibration.set_device_key_fn(None)
    calibration.reset()
    handles = [
        pn.register_op_override(dsl, "aten", "sub.Tensor", "CPU", calibration.gated("sub", own_cond(dsl), dsl), marking(dsl))
        for dsl in (SLOW, FAST)
    ]
    yield handles
    for handle in handles:
        handle.remove()
    for dsl in (SLOW, FAST):
        calibration.forget_gate("sub", dsl)
    REGISTRY.reset_switches()
    monkeypatch.delenv(calibration.ENV_VAR)
    calibration.reset()


def served_by(x: torch.Tensor) -> str | None:
    """Which DSL served ``torch.sub(x, x)`` through the dispatcher (None: aten), checked on the output too."""
    with pn.trace() as t:
        out = torch.sub(x, x)
    dsls = [e.dsl for e in t.events if e.op.startswith("sub") and e.outcome == "override"]
    assert len(dsls) <= 1, t.table()
    expected = MARK[dsls[0]] if dsls else 0.0
    assert torch.equal(out, torch.full_like(x, expected)), (dsls, out)
    return dsls[0] if dsls else None


def test_table_rows_per_dsl_and_old_rows_count_as_triton(twins):
    assert calibration.wins("sub", "float32", 3, "cpu", FAST) is True
    assert calibration.faster_rivals("sub", "float32", 3, "cpu", SLOW) == (FAST,)
    assert calibration.faster_rivals("sub", "float32", 3, "cpu", FAST) == ()
    assert calibration.wins("sub", "float32", 7, "cpu", FAST) is False
    assert calibration.faster_rivals("sub", "float32", 7, "cpu", SLOW) == ()
    assert calibration.wins("sub", "float32", 3, "cpu", "triton") is None
    verdicts = calibration._verdicts([{"op": "sub", "dtype": "float32", "bucket": 3, "wins": True}])
    assert set(verdicts[("sub", "float32")]) == {"triton"}


def test_calibrated_faster_dsl_serves_though_registered_later(twins):
    slow, fast = twins
    assert [o.dsl for o in slow._slot.overrides] == [SLOW, FAST]  # SLOW is tried first
    assert served_by(SMALL) == FAST


def test_disabling_the_faster_hands_over_to_the_other_then_aten(twins):
    with getattr(pn, FAST).disabled():
        assert served_by(SMALL) == SLOW
        with getattr(pn, SLOW).disabled():
            assert served_by(SMALL) is None
    assert served_by(SMALL) == FAST


def test_removing_the_faster_hands_over_to_the_other(twins):
    slow, fast = twins
    fast.remove()
    assert served_by(SMALL) == SLOW  # not aten: the removed rival no longer counts


def test_bucket_where_both_lose_goes_to_aten_and_a_lone_winner_serves(twins):
    assert served_by(LARGE) is None
    assert served_by(MIDDLE) == SLOW


def test_a_faster_rival_whose_cond_declines_does_not_steal_the_call(twins, monkeypatch):
    monkeypatch.setitem(ACCEPTS, FAST, False)
    assert served_by(SMALL) == SLOW


def test_report_lists_both_in_order_with_the_calibration_note(twins):
    data = report.collect()
    rows = [o for o in data["overrides"] if o["op"].startswith("aten::sub") and o["dsl"] in (SLOW, FAST)]
    assert [(o["dsl"], o["order"], o["slot_overrides"], o["calibrated"]) for o in rows] == [
        (SLOW, 1, 2, True), (FAST, 2, 2, True)
    ]
    text = report.render(data)
    assert "order 1 of 2" in text and "order 2 of 2" in text
    assert "first when calibrated faster" in text


def manual_softmax(dsl: str):
    """A softmax by hand (no aten::_softmax call), marked by ``dsl`` so the timed call is known to be its own."""

    def impl(x, dim, half_to_float):
        e = torch.exp(x - x.amax(dim, keepdim=True))
        return e / e.sum(dim, keepdim=True)

    impl.__name__ = f"{dsl}_softmax"
    return impl


def test_calibrate_times_every_installed_dsl_alone_side_by_side():
    """Both DSLs sit beside the Triton library, at its key: calibrated on the device it runs on."""
    import python_native_dsls.triton as backend
    from python_native.tools import bench

    if not backend.runtime_available():
        pytest.skip(f"triton backend unavailable: {backend.unavailable_reason()}")
    key, device = backend.dispatch_key(), backend.device_type()
    handles = [pn.register_op_override(dsl, "aten", "_softmax", key, own_cond(dsl), manual_softmax(dsl))
               for dsl in (SLOW, FAST)]
    getattr(pn, SLOW).disable()  # installed but switched off (as the CuTe DSL installs): still calibrated
    try:
        table = bench.calibrate(device, [torch.float32], quick=True, ops=["_softmax"])
        assert REGISTRY.is_off("dsl", SLOW) and not REGISTRY.is_off("dsl", FAST)  # switches restored
    finally:
        for handle in handles:
            handle.remove()
        REGISTRY.reset_switches()
    calibration.validate(table)
    by_dsl = {dsl: [r for r in table["rows"] if r["dsl"] == dsl] for dsl in {r["dsl"] for r in table["rows"]}}
    assert {SLOW, FAST, "triton"} <= set(by_dsl)
    shapes = [r["shape"] for r in by_dsl["triton"]]
    assert [r["shape"] for r in by_dsl[SLOW]] == shapes == [r["shape"] for r in by_dsl[FAST]]
    for rows in by_dsl.values():
        assert all(r["op"] == "_softmax" and r["override_ms"] > 0 and r["aten_ms"] > 0 for r in rows)
    # The same aten baseline per shape for every DSL: they are compared against one measurement.
    assert [r["aten_ms"] for r in by_dsl[SLOW]] == [r["aten_ms"] for r in by_dsl["triton"]]


def test_cutedsl_conds_go_through_the_same_gate_when_a_table_exists(monkeypatch):
    import python_native_dsls.cutedsl as cutedsl

    installed = []

    def register(dsl, lib, op, key, cond, impl, **kw):
        # What the dispatch core would route: the cond through every feature's wrapper.
        handle = types.SimpleNamespace(dsl=dsl, op=op, dispatch_key=key, cond=cond, impl=impl, chosen_impl=impl)
        handle.functional = handle
        installed.append((dsl, op, key, extensions.routed_pieces(handle)[0]))
        return object()

    monkeypatch.setattr(calibration.gates, "could_gate", lambda dispatch_key, dsl, op: True)
    monkeypatch.setattr(calibration, "leave_out", lambda op, dsl, dispatch_key: None)
    monkeypatch.setattr(REGISTRY, "register", register)
    was_off = REGISTRY.is_off("dsl", "cutedsl")
    try:
        cutedsl.register_overrides()
    finally:
        if not was_off:
            REGISTRY.enable("dsl", ["cutedsl"])
        for dsl, op, *_ in installed:
            calibration.forget_gate(op, dsl)
    assert installed and "_softmax" in {op for _, op, _, _ in installed}
    assert all(dsl == "cutedsl" and key == "CUDA" and getattr(calibration.gate_of(cond), "dsl", None) == "cutedsl"
               for dsl, _, key, cond in installed)
