"""Calibration tables: loading, lookup, the gate around conds, and the gate in the real dispatcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from calibration_testing import FAKE_DEVICE, FAKE_GPU, recorded_registration, routing_probe, table

import python_native_dsls.triton as backend
from python_native.features import calibration


@pytest.fixture
def use_table(calib):
    """A table file named by PYTHON_NATIVE_CALIBRATION, CPU tensors reporting ``device_key``, no
    shipped table (so no portable policy evidence either)."""

    def install(content: dict, device_key: str = FAKE_DEVICE):
        path = calib.shipped.parent / "table.json"
        path.write_text(json.dumps(content))
        calib.env(path)
        calib.device(device_key)
        return path

    return install


def test_size_bucket_is_bit_length_of_numel():
    assert [calibration.size_bucket(n) for n in (0, 1, 255, 256, 1 << 30)] == [0, 1, 8, 9, 31]
    assert calibration.size_bucket(1 << 100) == calibration.MAX_BUCKET


def test_lookup_per_op_dtype_bucket_with_nearest_bucket_fill(use_table):
    use_table(table())
    device = calibration.device_key("cpu")
    assert device == FAKE_DEVICE
    assert calibration.wins("_softmax", "float32", 9, device) is True
    assert calibration.wins("_softmax", "float32", 11, device) is False  # any losing shape makes the bucket lose
    assert calibration.wins("_softmax", "float32", 10, device) is True  # nearest calibrated: 9 (ties go low)
    assert calibration.wins("_softmax", "float32", 12, device) is False
    assert calibration.wins("_softmax", "float32", 40, device) is True  # beyond the range: bucket 13
    assert calibration.wins("_softmax", "float32", 1, device) is True
    assert calibration.wins("_softmax", "bfloat16", 9, device) is None  # dtype not calibrated
    assert calibration.wins("_log_softmax", "float32", 9, device) is None  # op not calibrated
    assert calibration.wins("_softmax", "float32", 9, "Other GPU/sm80") is None  # device not calibrated
    assert calibration.wins("_softmax", "float32", 11) is False  # default: this process's device (interpreter)


def test_gate_declines_only_where_the_table_says_the_override_loses(use_table):
    use_table(table())
    calls = []

    def cond(x, dim, half_to_float):
        calls.append(x.shape)
        return dim == -1

    gate = calibration.gated("_softmax", cond)
    assert gate(torch.randn(4, 64), -1, False) is True  # 256 elements: bucket 9, wins
    assert gate(torch.randn(16, 64), -1, False) is False  # bucket 11: loses, the cond is not even asked
    assert gate(torch.randn(4, 64), 0, False) is False  # a winning bucket: the cond still decides
    assert gate(torch.randn(16, 64, dtype=torch.float64), -1, False) is True  # uncalibrated dtype: cond decides
    assert calls == [torch.Size([4, 64]), torch.Size([4, 64]), torch.Size([16, 64])]
    assert gate.__wrapped__ is cond


def test_narrow_and_wide_rows_of_one_bucket_have_their_own_verdicts(use_table):
    rows = [
        {"op": "_softmax", "dtype": "float32", "bucket": 14, "shape": [8, 1024], "last_dim": 1024, "wins": False},
        {"op": "_softmax", "dtype": "float32", "bucket": 14, "shape": [1, 8192], "last_dim": 8192, "wins": True},
        {"op": "_softmax", "dtype": "float32", "bucket": 18, "shape": [32, 8192], "wins": False},  # no last_dim: shape
    ]
    use_table(table(rows=rows))
    device = calibration.device_key("cpu")
    assert calibration.wins("_softmax", "float32", 14, device, last_dim=1024) is False
    assert calibration.wins("_softmax", "float32", 14, device, last_dim=8192) is True
    assert calibration.wins("_softmax", "float32", 18, device, last_dim=8192) is False
    assert calibration.wins("_softmax", "float32", 18, device, last_dim=512) is False  # narrow: its class is empty
    gate = calibration.gated("_softmax", lambda x, dim, h: True)
    assert gate(torch.randn(8, 1024), -1, False) is False
    assert gate(torch.randn(1, 8192), -1, False) is True
    assert gate(torch.randn(2, 4096), -1, False) is True  # the same bucket, wide: nearest wide verdict


def test_confirmed_wins_need_every_larger_size_to_win_too():
    def row(bucket, speedup, last_dim=1024, op="_softmax"):
        return {"op": op, "dtype": "float32", "bucket": bucket, "last_dim": last_dim, "speedup": speedup, "wins": None}

    rows = [row(14, 1.5), row(16, 0.9), row(18, 1.2), row(20, 1.3),  # 14 won below a loss: noise
            row(14, 1.08, 8192), row(16, 1.07, 8192),  # largest wide bucket: 1.07 < 1.10, 1.08 >= 1.05 below
            row(14, 0.99, op="silu"), row(16, 1.08, op="silu")]  # largest: neither twice the margin nor confirmed
    calibration.confirm_wins(rows, 1.05)
    assert [r["wins"] for r in rows] == [False, False, True, True, True, True, False, False]


def test_suspended_gates_let_every_override_run(use_table):
    use_table(table())
    gate = calibration.gated("_softmax", lambda x, dim, h: True)
    with calibration.suspended():
        assert gate(torch.randn(16, 64), -1, False) is True
    assert gate(torch.randn(16, 64), -1, False) is False


def test_never_wins_needs_every_row_for_the_devices_a_key_serves_to_lose(use_table, calib):
    use_table(table())
    assert calibration.never_wins("silu", dispatch_key="CPU") is True
    assert calibration.never_wins("_softmax", dispatch_key="CPU") is False
    assert calibration.never_wins("gelu", dispatch_key="CPU") is False  # no rows and no evidence: keep it
    calib.gpus([])  # NVML: no GPU at all, so the CUDA key serves no device and nothing is judged there
    assert calibration.never_wins("silu", dispatch_key="CUDA") is False


@pytest.mark.parametrize(
    "machine, dropped",
    [
        ([FAKE_DEVICE], True),  # every GPU is the calibrated model: its table decides
        ([FAKE_DEVICE, "Other GPU/sm80"], False),  # mixed models: the other one has nothing saying silu loses
        (["Other GPU/sm80"], False),  # an uncalibrated model (and no evidence for a policy) keeps the op
        (None, False),  # no NVML (no driver): any GPU could be there
    ],
)
def test_packaged_tables_drop_an_op_only_for_the_models_nvml_names(calib, monkeypatch, machine, dropped):
    from python_native.foundations import nvml

    calib.ship(table())
    monkeypatch.setattr(nvml, "device_keys", lambda: None if machine is None else frozenset(machine))
    calibration.reset()
    assert calibration.never_wins("silu") is dropped
    assert calibration.never_wins("_softmax") is False


@pytest.mark.parametrize(
    "table_device, key, machine, needed",
    [
        ("cpu", "CPU", None, True),  # a table for the interpreter's device
        (FAKE_DEVICE, "CPU", None, False),  # only a GPU's table: the CPU key needs no gate
        (FAKE_DEVICE, "CUDA", [FAKE_DEVICE], True),
        (FAKE_DEVICE, "CUDA", ["Other GPU/sm80"], False),  # no table (nor evidence) for this machine's GPU
        (FAKE_DEVICE, "CUDA", None, True),  # NVML cannot tell: gate, the gate resolves per device
    ],
)
def test_tables_gate_only_the_keys_they_can_apply_to(calib, monkeypatch, table_device, key, machine, needed):
    from python_native.foundations import nvml

    path = calib.ship(table(device=table_device))
    monkeypatch.setattr(nvml, "device_keys", lambda: None if machine is None else frozenset(machine))
    calibration.reset()
    assert calibration.gates_needed(key) is needed
    calib.env(path)  # the same table named by the variable: the same answer
    assert calibration.gates_needed(key) is needed
    calib.env(None)
    path.unlink()
    calibration.reset()
    assert calibration.gates_needed(key) is False  # no table at all


class _FakeNvml:
    """libnvidia-ml's entry points as ``nvml.devices`` calls them, over a list of GPUs
    ``(name, major, minor, cores, bus bits, memory MHz, SM MHz)``; ``lacking`` names entry points to leave out."""

    def __init__(self, gpus: list[tuple], init_status: int = 0, lacking: tuple[str, ...] = ()):
        self.gpus, self.init_status, self.shut, self.lacking = gpus, init_status, False, lacking

    def __getattr__(self, name):  # an entry point this driver does not have
        raise AttributeError(name)

    def __getattribute__(self, name):
        if name in object.__getattribute__(self, "lacking"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def nvmlInit_v2(self):
        return self.init_status

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = len(self.gpus)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = index + 1
        return 0

    def _gpu(self, handle):
        return self.gpus[handle.value - 1]

    def nvmlDeviceGetName(self, handle, buffer, length):
        buffer.value = self._gpu(handle)[0]
        return 0

    def nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        major._obj.value, minor._obj.value = self._gpu(handle)[1:3]
        return 0

    def nvmlDeviceGetNumGpuCores(self, handle, cores):
        cores._obj.value = self._gpu(handle)[3]
        return 0

    def nvmlDeviceGetMemoryBusWidth(self, handle, bits):
        bits._obj.value = self._gpu(handle)[4]
        return 0

    def nvmlDeviceGetMaxClockInfo(self, handle, clock, mhz):
        mhz._obj.value = self._gpu(handle)[5 if clock == 2 else 6]
        return 0


H100_NVML = (b"NVIDIA H100 80GB HBM3", 9, 0, 16896, 5120, 2619, 1980)
A100_NVML = (b"NVIDIA A100-SXM4-40GB", 8, 0, 6912, 5120, 1215, 1410)


@pytest.mark.parametrize(
    "gpus, init_status, expected",
    [
        ([H100_NVML] * 8, 0, frozenset({"NVIDIA H100 80GB HBM3/sm90"})),
        ([H100_NVML, A100_NVML], 0, frozenset({"NVIDIA H100 80GB HBM3/sm90", "NVIDIA A100-SXM4-40GB/sm80"})),
        ([], 0, frozenset()),
        ([H100_NVML], 9, None),  # NVML failed to initialise (no driver running)
    ],
)
def test_nvml_probe_names_each_model_as_calibration_keys_them(monkeypatch, gpus, init_status, expected):
    import ctypes

    from python_native.foundations import nvml

    fake = _FakeNvml(gpus, init_status)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    nvml.cache_clear()
    try:
        assert nvml.device_keys() == expected
        assert fake.shut is (init_status == 0)  # shut down exactly when it was initialised
    finally:
        nvml.cache_clear()


def test_nvml_reads_what_each_gpu_has_and_tolerates_a_driver_without_the_entry_points(monkeypatch):
    """SMs from the core count (64 per SM on the A100, 128 on Hopper), bandwidth from bus width x
    memory clock x 2; a driver lacking an entry point leaves that figure unknown, the rest stands."""
    import ctypes

    from python_native.foundations import nvml

    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeNvml([H100_NVML, A100_NVML]))
    nvml.cache_clear()
    try:
        h100 = nvml.properties("NVIDIA H100 80GB HBM3/sm90")
        assert h100["sm_count"] == 132 and h100["sm_clock_mhz"] == 1980
        assert h100["memory_bandwidth_gbps"] == pytest.approx(3352.3, abs=0.1)  # the H100 SXM's 3.35 TB/s
        a100 = nvml.properties("NVIDIA A100-SXM4-40GB/sm80")
        assert a100["sm_count"] == 108 and a100["memory_bandwidth_gbps"] == pytest.approx(1555.2, abs=0.1)
        assert nvml.properties("NVIDIA B200/sm100") is None  # not on this machine
        monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeNvml([H100_NVML], lacking=("nvmlDeviceGetNumGpuCores",
                                                                                         "nvmlDeviceGetMaxClockInfo")))
        nvml.cache_clear()
        assert nvml.properties("NVIDIA H100 80GB HBM3/sm90") == {}  # known by name, its figures not
        assert nvml.device_keys() == frozenset({"NVIDIA H100 80GB HBM3/sm90"})
    finally:
        nvml.cache_clear()


def test_nvml_probe_answers_without_a_driver_or_names_models():
    from python_native.foundations import nvml

    keys = nvml.device_keys()
    assert keys is None or all("/sm" in key for key in keys)


def test_bad_tables_are_named(calib, use_table):
    with pytest.raises(ValueError, match="format"):
        calibration.validate({"format": 99, "device": "d", "rows": []}, "t.json")
    with pytest.raises(ValueError, match=r'bucket "x" \(a string\)'):
        calibration.validate(table(rows=[{"op": "silu", "dtype": "float32", "bucket": "x", "wins": True}]), "t.json")
    with pytest.raises(ValueError, match=r"lacks \['wins'\]"):
        calibration.validate(table(rows=[{"op": "silu", "dtype": "float32", "bucket": 3}]), "t.json")
    missing = calib.shipped.parent / "missing.json"
    calib.env(missing)
    assert calibration.gates_needed("CPU") is False
    skipped = calibration.describe()["skipped"]
    assert [(s["path"], s["reason"]) for s in skipped] == [(str(missing), "no such table file or folder")]
    assert calibration.ENV_VAR in skipped[0]["fix"]
    # A broken table never breaks the op: the gate behaves as uncalibrated.
    use_table({"format": 1, "device": FAKE_DEVICE, "rows": "nope"})
    assert calibration.gated("_softmax", lambda *a: True)(torch.randn(4, 64), -1, False) is True


def test_describe_names_the_table_in_force(use_table):
    path = use_table(table(device="cpu"), device_key="cpu")
    info = calibration.describe()
    assert info["source"] == f"{calibration.ENV_VAR}={path}"
    [found] = info["tables"]
    assert {k: found[k] for k in ("device", "path", "origin", "rows", "drift", "use")} == {
        "device": "cpu", "path": str(path), "origin": calibration.ENV_VAR, "rows": 6, "drift": [],
        "use": "in force for cpu"}
    assert found["versions"]["torch"] == calibration.sources.major_minor(torch.__version__)
    assert info["device"] == "cpu" and info["in_force"] == str(path)  # interpreter mode: the device is known
    [device] = info["devices"]
    assert device["gated_by"][0]["path"] == str(path) and device["left_out"] == {"triton": ["silu"]}
    assert device["thresholds"]["triton"]["_softmax"]["float32"] == {
        "narrow": [[0, 10], [13, 63]], "wide": [[0, 10], [13, 63]], "source": str(path)}


def test_folder_of_tables(calib):
    folder = calib.shipped.parent / "mine"
    folder.mkdir()
    for name, device in (("a.json", "A/sm80"), ("b.json", "B/sm90")):
        (folder / name).write_text(json.dumps(table(device=device)))
    calib.env(folder)
    assert [t["device"] for t in calibration.describe()["tables"]] == ["A/sm80", "B/sm90"]
    assert calibration.wins("_softmax", "float32", 11, "B/sm90") is False


def test_register_overrides_binds_plain_conds_without_tables_and_gates_with_one(calib, monkeypatch, use_table):
    recorded = recorded_registration(monkeypatch)
    from python_native_dsls.triton.ops import all_overrides

    plain = {spec.op: spec.cond for spec in all_overrides()}
    calib.env(calib.shipped)  # an empty folder: no table anywhere
    backend.register_overrides()
    assert recorded == plain  # the very same functions: no wrapper, no cost

    recorded.clear()
    use_table(table())
    # The device the backend's key serves is the table's: CPU tensors report it under the
    # interpreter (the CPU key), NVML lists it on a GPU (the CUDA key).
    calib.gpus([FAKE_GPU])
    backend.register_overrides()
    assert "silu" not in recorded  # loses everywhere it was calibrated: never installed
    assert "silu" in calibration.left_out()[backend.dispatch_key()]["triton"]
    assert set(recorded) == set(plain) - {"silu"}
    assert recorded["_softmax"].__wrapped__ is plain["_softmax"]  # the table speaks for it: gated
    assert all(recorded[op] is plain[op] for op in recorded if op != "_softmax")  # nothing speaks: unwrapped


@pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
def test_gate_in_the_real_dispatcher(tmp_path):
    """A fresh process with a table for its device: the router falls back where the override loses."""
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(table(device="cpu")))
    script = "import torch, python_native as pn\n" + routing_probe(((4, 64), (16, 64)))
    env = {**os.environ, calibration.ENV_VAR: str(path), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "4 [('_softmax', 'triton', 'override')]"  # bucket 9: the override wins
    assert lines[1] == "16 [('_softmax', None, 'fallback')]"  # bucket 11: aten is faster, the gate declines
    assert lines[2] == "silu []"  # never wins on this device: not even routed


@pytest.mark.filterwarnings("ignore::python_native.features.calibration.CalibrationDriftWarning")
def test_shipped_tables_are_valid_and_drop_only_the_ops_at_parity(monkeypatch):
    """Each packaged table validates; on the H100's, the elementwise ops (at parity with aten) never
    win, so a machine of H100s does not install them, while the row kernels do win somewhere. The
    H100 table records no kernel versions (it predates them): for every op whose kernels this
    process runs, its rows count as unmeasured, and the portable policy derived from it gates."""
    from calibration_testing import H100

    from python_native.foundations import nvml

    paths = sorted(calibration.sources.PACKAGED_DIR.glob("*.json"))
    assert paths, "no calibration table is shipped"
    for path in paths:  # named after their device: registration matches them to the machine by name
        assert path.name == calibration.table_filename(calibration.load(path)["device"])
    monkeypatch.delenv(calibration.ENV_VAR, raising=False)
    monkeypatch.setattr(nvml, "devices", lambda: (H100,))
    calibration.reset()
    try:
        dropped = {op for op in ("silu", "silu_backward", "gelu", "gelu_backward", "_softmax", "native_layer_norm",
                                 "_fused_rms_norm_backward", "bmm") if calibration.never_wins(op)}
        assert dropped == {"silu", "silu_backward", "gelu", "gelu_backward"}
        h100 = H100.key
        [shipped] = calibration.resolve.resolution(h100).tables
        assert "triton _softmax" in shipped.info()["stale"] and shipped.verdicts("_softmax", "bfloat16", "triton") is None
        assert calibration.wins("_softmax", "bfloat16", 26, h100, last_dim=8192) is True  # the policy: from 24 + 1
        assert calibration.wins("_softmax", "bfloat16", 24, h100, last_dim=8192) is False
        assert calibration.wins("_softmax", "bfloat16", 12, h100, last_dim=64) is False  # tiny: host-bound
    finally:
        calibration.reset()
