"""The portable policy and the precedence of the sources, on simulated GPUs (NVML's answers and the
device keys of tensors faked), and the decline masks a compiled front reads, against the gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from calibration_testing import A100, B200, H100, H200, recorded_registration, routing_probe, rows_winning_from, table

import python_native_dsls.triton as backend
from python_native.features import calibration
from python_native.features.calibration import portable
from python_native.foundations import nvml

REF = "Ref GPU/sm90"
REF_PROPS = {"sm_count": 100, "memory_bandwidth_gbps": 2000.0}


def evidence_table(device: str = REF, props: dict | None = None) -> dict:
    """Evidence: _softmax float32 wins from bucket 20 on narrow rows and 18 on wide ones; _log_softmax
    float32 never on narrow rows, from 24 on wide ones; silu float32 never."""
    rows = (rows_winning_from("_softmax", "float32", {0: 20, 1: 18})
            + rows_winning_from("_log_softmax", "float32", {0: None, 1: 24})
            + rows_winning_from("silu", "float32", {0: None, 1: None}))
    return table(device, rows, device_properties=props or REF_PROPS)


def gpu(name: str, sms: int, bandwidth_gbps: float) -> nvml.Gpu:
    """A fake GPU with exactly this bandwidth (a 4000-bit bus: 1 GB/s per MHz of memory clock)."""
    return nvml.Gpu(name, 9, 0, sm_count=sms, memory_bus_width_bits=4000, memory_clock_mhz=int(bandwidth_gbps))


def first_fired(op: str, dtype: str, device: str, last_dim: int) -> int | None:
    """The smallest bucket from which every larger one fires (None: never)."""
    first = None
    for b in range(63, -1, -1):
        if not calibration.wins(op, dtype, b, device, last_dim=last_dim):
            break
        first = b
    return first


@pytest.mark.parametrize(
    "sms, bandwidth, shift",
    [
        (100, 2000.0, 0),  # the reference GPU itself: the measured thresholds, plus the margin
        (100, 1000.0, 0),  # a slower GPU never gets a lower threshold than the one measured
        (100, 4000.0, 1),  # twice the bandwidth: twice the elements to amortise the host cost
        (100, 6000.0, 2),  # three times: rounded up to the next power of two
        (120, 2000.0, 1),  # 20% more SMs to fill: one bucket
    ],
)
def test_thresholds_scale_by_what_the_gpu_has(calib, sms, bandwidth, shift):
    calib.ship(evidence_table())
    target = gpu("Target GPU", sms, bandwidth)
    calib.gpus([target])
    margin = portable.MARGIN_BUCKETS
    assert first_fired("_softmax", "float32", target.key, 1024) == 20 + shift + margin
    assert first_fired("_softmax", "float32", target.key, 8192) == 18 + shift + margin
    assert first_fired("_log_softmax", "float32", target.key, 1024) is None  # lost on narrow rows: stays off
    assert first_fired("_log_softmax", "float32", target.key, 8192) == 24 + shift + margin
    assert calibration.wins("silu", "float32", 40, target.key) is False
    assert calibration.wins("_softmax", "bfloat16", 40, target.key, last_dim=8192) is False  # no evidence: declined
    assert calibration.wins("rms_norm_of_someone_else", "float32", 40, target.key) is None  # not the policy's op


def test_a_gpu_nvml_cannot_describe_is_assumed_as_fast_as_the_fastest_known(calib):
    calib.ship(evidence_table())
    calib.gpus(None)  # no NVML
    shift = portable.shift(portable.ASSUMED, REF_PROPS)
    assert shift == 2  # 8000 / 2000 GB/s: four times the bandwidth
    assert first_fired("_softmax", "float32", "Mystery GPU/sm100", 1024) == 20 + shift + portable.MARGIN_BUCKETS
    info = calibration.describe()  # no device is seen here (interpreter: cpu; NVML: none)
    assert [e["device"] for e in info["portable"]["evidence"]] == [REF]


def test_every_evidence_table_must_have_won_and_the_largest_threshold_holds(calib):
    other = "Other Ref/sm80"
    calib.ship(evidence_table())
    rows = (rows_winning_from("_softmax", "float32", {0: 16, 1: 22})
            + rows_winning_from("_log_softmax", "float32", {0: 20, 1: None}))
    calib.ship(table(other, rows, device_properties=REF_PROPS))
    target = gpu("Target GPU", 100, 2000.0)
    calib.gpus([target])
    m = portable.MARGIN_BUCKETS
    assert first_fired("_softmax", "float32", target.key, 1024) == 20 + m  # max(20, 16)
    assert first_fired("_softmax", "float32", target.key, 8192) == 22 + m  # max(18, 22)
    assert first_fired("_log_softmax", "float32", target.key, 1024) is None  # never on the first table
    assert first_fired("_log_softmax", "float32", target.key, 8192) is None  # never on the second
    # An op one table lacks: the other alone speaks for it.
    calib.ship(table(other, rows_winning_from("gelu", "float32", {0: 18, 1: 18}), device_properties=REF_PROPS))
    assert first_fired("gelu", "float32", target.key, 1024) == 18 + m


def test_a_shipped_table_without_device_properties_is_no_evidence(calib):
    content = evidence_table()
    del content["device_properties"]
    calib.ship(content)
    calib.gpus([gpu("Target GPU", 100, 2000.0)])
    assert calibration.wins("_softmax", "float32", 40, "Target GPU/sm90") is None
    assert "no device_properties" in calibration.describe()["portable"]["notes"][0]


def test_ops_that_never_won_are_not_installed_and_the_rest_are_gated(calib, monkeypatch):
    """Registration through the real backend at its own key (CPU under the interpreter, CUDA on a
    GPU), whose device here is a fake GPU."""
    from python_native_dsls.triton.ops import all_overrides

    recorded = recorded_registration(monkeypatch)
    calib.ship(evidence_table())
    target = gpu("Target GPU", 100, 2000.0)
    calib.gpus([target])
    calib.device(target.key)
    plain = {spec.op: spec.cond for spec in all_overrides()}
    backend.register_overrides()
    assert "silu" not in recorded and calibration.left_out()[backend.dispatch_key()]["triton"]["silu"].startswith("slower than aten")
    assert calibration.is_gated(recorded["_softmax"]) and calibration.is_gated(recorded["_log_softmax"])
    assert all(recorded[op] is plain[op] for op in recorded if op not in ("_softmax", "_log_softmax"))
    [device] = calibration.describe()["devices"]
    assert device["device"] == target.key and device["left_out"] == {"triton": ["silu"]}
    assert device["gated_by"][0]["kind"] == "portable"
    assert device["thresholds"]["triton"]["_softmax"]["float32"]["narrow"] == [[21, 63]]


def test_the_shipped_h100_table_is_the_evidence(monkeypatch):
    """The rule on the real evidence: the numbers docs/benchmarks.md states."""
    monkeypatch.delenv(calibration.ENV_VAR, raising=False)
    monkeypatch.setenv(calibration.ENV_VAR, calibration.PORTABLE)  # the policy even on the H100 itself
    monkeypatch.setattr(nvml, "devices", lambda: (H100, H200, A100, B200))
    calibration.reset()
    try:
        h100, h200, a100, b200 = (g.key for g in (H100, H200, A100, B200))
        assert first_fired("_softmax", "bfloat16", h100, 8192) == 25  # won from 24 on the H100; +1 margin
        assert first_fired("_softmax", "bfloat16", a100, 8192) == 25  # slower: never lower
        assert first_fired("_softmax", "bfloat16", h200, 8192) == 26  # 4.9 / 3.35 TB/s: one more bucket
        assert first_fired("_softmax", "bfloat16", b200, 8192) == 27  # 8.2 / 3.35 TB/s: two more
        assert first_fired("native_layer_norm_backward", "bfloat16", h100, 1024) is None  # lost on narrow rows
        assert first_fired("native_layer_norm_backward", "bfloat16", h100, 8192) == 27
        assert first_fired("bmm", "float32", h100, 1) == 21
        for key in (h100, h200, a100, b200):
            for op in ("silu", "silu_backward", "gelu", "gelu_backward"):
                assert calibration.resolve.resolution(key).never_wins("triton", op)
            assert not calibration.resolve.resolution(key).never_wins("triton", "_softmax")
        assert calibration.never_wins("gelu", dispatch_key="CUDA") is True  # every GPU NVML lists agrees
    finally:
        monkeypatch.undo()
        calibration.reset()


def test_precedence_variable_then_user_then_shipped_then_portable(calib):
    """One GPU, four sources: each answers for bucket 9 of _softmax float32 in its own way."""
    key = H100.key
    calib.gpus([H100])
    calib.device(key)

    def says(win: bool) -> list:
        return [{"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": win}]

    calib.ship(table(REF, rows_winning_from("_softmax", "float32", {0: 20, 1: 20})
                     + rows_winning_from("_softmax", "bfloat16", {0: 20, 1: 20}), device_properties=REF_PROPS))
    # The H100 against the reference: 3.35 / 2 TB/s, 132 / 100 SMs: one bucket more, and the margin.
    assert first_fired("_softmax", "float32", key, 1024) == 22
    assert calibration.wins("_softmax", "float32", 9, key) is False  # the portable policy
    calib.ship(table(key, says(True)))
    assert calibration.wins("_softmax", "float32", 9, key) is True  # the shipped table
    user = calib.user(table(key, says(False)))
    assert calibration.wins("_softmax", "float32", 9, key) is False  # the user's table
    assert calibration.wins("_softmax", "bfloat16", 30, key) is True  # a dtype the tables lack: the policy speaks
    mine = calib.shipped.parent / "mine.json"
    mine.write_text(json.dumps(table(key, says(True))))
    calib.env(mine)
    assert calibration.wins("_softmax", "float32", 9, key) is True  # the variable, over everything
    info = calibration.describe()
    [device] = info["devices"]
    assert [g.get("path", g["kind"]) for g in device["gated_by"]] == [str(mine), "portable"]
    assert {t["path"]: t["use"] for t in info["tables"]}[str(mine)] == f"in force for {key}"
    calib.env(calibration.PORTABLE)  # the policy alone, tables ignored
    assert calibration.wins("_softmax", "float32", 9, key) is False
    calib.env(calibration.OFF)  # no gate at all
    assert calibration.wins("_softmax", "float32", 9, key) is None
    assert calibration.gates_needed("CUDA") is False
    calib.env(None)
    assert user.exists() and calibration.wins("_softmax", "float32", 9, key) is False


def test_a_table_for_another_gpu_leaves_this_one_to_the_portable_policy(calib):
    calib.ship(evidence_table())
    target = gpu("Target GPU", 100, 2000.0)
    calib.gpus([target])
    mine = calib.shipped.parent / "other.json"
    mine.write_text(json.dumps(table("Elsewhere/sm80", [{"op": "_softmax", "dtype": "float32", "bucket": 9,
                                                          "wins": True}])))
    calib.env(mine)
    assert calibration.wins("_softmax", "float32", 9, target.key) is False  # the policy, not the other GPU's table
    assert calibration.wins("_softmax", "float32", 9, "Elsewhere/sm80") is True


def _realizable(bucket: int, wide: int) -> tuple[int, ...] | None:
    """A shape of that size bucket and width class, where one exists."""
    if bucket == 0:
        return (0, 4096 if wide else 32)
    n = 1 << (bucket - 1)
    if wide:
        return (n // 4096, 4096) if n >= 4096 else None
    return (n // 32, 32) if n >= 32 else (n,)


@pytest.mark.parametrize("source", ["table", "portable"])
def test_decline_masks_agree_with_the_gate_at_every_bucket(calib, source):
    key = "Target GPU/sm90"
    if source == "table":
        rows = [{"op": "_softmax", "dtype": "float32", "bucket": b, "last_dim": d, "wins": w}
                for b, d, w in ((9, 64, True), (11, 64, False), (13, 64, True), (14, 8192, False), (20, 8192, True),
                                (40, 64, False))]
        rows.append({"op": "_softmax", "dtype": "bfloat16", "bucket": 30, "wins": True})
        calib.ship(table(key, rows))
    else:
        calib.ship(evidence_table())
    calib.gpus([gpu("Target GPU", 100, 4000.0)])
    calib.device(key)
    gate = calibration.gated("_softmax", lambda *a: True)
    masks = gate.decline_masks(key)
    dtypes = ("float32", "bfloat16", "float64")
    if source == "table":
        assert set(masks) == {"float32", "bfloat16"}  # float64: no verdict, absent
    else:
        assert set(masks) >= set(dtypes) and masks["float64"] == (2**64 - 1, 2**64 - 1)  # no evidence: declined
    checked = 0
    for name in dtypes:
        for wide in (0, 1):
            for b in range(64):
                declines = name in masks and bool(masks[name][wide] >> b & 1)
                verdict = calibration.wins("_softmax", name, b, key, last_dim=8192 if wide else 64)
                assert declines == (verdict is False), (name, wide, b)
                shape = _realizable(b, wide)
                if shape is not None and b < 60:  # larger ones overflow a byte count even on the meta device
                    t = torch.empty(shape, device="meta", dtype=getattr(torch, name))
                    assert calibration.size_bucket(t.numel()) == b and calibration.width_class(t.shape[-1]) == wide
                    assert calibration.cell_of(t) == 2 * b + wide  # the rule the gate writes out
                    assert (gate(t, -1, False) is False) == declines, (name, wide, b)
                    checked += 1
    assert checked > 250
    assert calibration.gated("gelu_of_someone", lambda *a: True).decline_masks(key) is None  # nothing known
    with calibration.suspended():
        assert gate.decline_masks(key) is None  # calibrating: nothing declines


def test_gate_changes_refresh_the_routers(calib, monkeypatch):
    """reset(), suspended() and set_device_key_fn re-select every router (a compiled front re-reads masks)."""
    from python_native.core.registry import REGISTRY

    calls = []
    monkeypatch.setattr(REGISTRY, "refresh_all", lambda: calls.append(1))
    calibration.reset()
    with calibration.suspended():
        pass
    calibration.set_device_key_fn(None)
    assert len(calls) == 4


@pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
def test_portable_policy_in_the_real_dispatcher(tmp_path):
    """A fresh process whose CPU tensors stand for a GPU NVML describes: the Triton library is
    installed again under the portable policy; calls route by it, silu is not installed."""
    (tmp_path / "ref_gpu_sm90.json").write_text(json.dumps(table(REF, rows_winning_from(
        "_softmax", "float32", {0: 9, 1: 13}, buckets=range(7, 16, 2)) + rows_winning_from(
        "silu", "float32", {0: None, 1: None}), device_properties=REF_PROPS)))
    script = textwrap.dedent(f"""
        import json, pathlib, torch, python_native as pn
        import python_native_dsls.triton as backend
        from python_native.features import calibration
        from python_native.foundations import nvml
        from python_native.core.registry import REGISTRY
        calibration.sources.PACKAGED_DIR = pathlib.Path({str(tmp_path)!r})
        fake = nvml.Gpu("Target GPU", 9, 0, sm_count=100, memory_bus_width_bits=4000, memory_clock_mhz=4000)
        nvml.devices = lambda: (fake,)
        calibration.set_device_key_fn(lambda device: fake.key)
        for o in [o for o in REGISTRY.overrides() if o.dsl == "triton" and o.derived_from is None]:
            o.remove()
        backend.register_overrides()
    """) + routing_probe(((8, 64), (32, 64))) + 'print(json.dumps(pn.status()["calibration"]["devices"][0]["left_out"]))\n'
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env.pop(calibration.ENV_VAR, None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # 512 elements (bucket 10): below 9 + 1 (twice the bandwidth) + 1 (margin); 2048 (bucket 12): fires.
    assert lines[0] == "8 [('_softmax', None, 'fallback')]"
    assert lines[1] == "32 [('_softmax', 'triton', 'override')]"
    assert lines[2] == "silu []"  # never won: not installed, not even routed
    assert json.loads(lines[3]) == {"triton": ["silu"]}
