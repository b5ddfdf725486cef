"""The status report, the CLI's help and JSON, and how a trace prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import python_native as pn
import python_native_dsls.triton as backend
from conftest import always, marked_sub
from python_native import __main__ as cli
from python_native.tools import demo, report

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")}
    environ.update({"PYTHONPATH": str(ROOT), **env})
    return subprocess.run(
        [sys.executable, "-m", "python_native", *args], capture_output=True, text=True, env=environ, timeout=300
    )


def test_report_has_legend_switches_and_skipped_families(monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    data = pn.status()
    assert set(data["legend"]) == {"available", "unavailable", "enabled", "active", "inactive", "never reached", "variants"}
    switches = {e["name"]: e for e in data["environment"]}
    assert switches["PYTHON_NATIVE_CHECK"]["value"] == "1" and "aten" in switches["PYTHON_NATIVE_CHECK"]["meaning"]
    # The root conftest.py sets it for the session: "1" through Triton's interpreter, "0" on a GPU.
    interpret = switches["PYTHON_NATIVE_TRITON_INTERPRET"]
    assert interpret["value"] == os.environ["PYTHON_NATIVE_TRITON_INTERPRET"] in ("0", "1")
    assert interpret["set_by"] == "PYTHON_NATIVE_TRITON_INTERPRET"
    assert {"PYTHON_NATIVE_DISABLE", "PYTHON_NATIVE_ORDER_FN", "PYTHON_NATIVE_DUMP_DIR"} <= set(switches)
    text = report.render(data)
    for word in ("Legend", "inactive", "Environment switches", "PYTHON_NATIVE_CHECK = '1'"):
        assert word in text
    triton = next(d for d in data["dsls"] if d["name"] == "triton")
    key = backend.dispatch_key()
    if not torch._C._dispatch_has_computed_kernel_for_dispatch_key("aten::_fused_rms_norm_backward", key):
        assert "_fused_rms_norm_backward" in triton["skipped"]["rms_norm"]
        assert f"not installed: rms_norm (aten::_fused_rms_norm_backward has no kernel at {key}" in text
    else:
        assert "rms_norm" not in triton["skipped"]
    assert json.loads(report.to_json(data)) == json.loads(json.dumps(data))


def test_long_reasons_keep_columns_aligned():
    reason = "a very long reason why this DSL cannot run here, " * 4
    data = {
        "torch": "x",
        "dsls": [
            {"name": "alpha", "available": False, "reason": reason, "hint": None, "version": "1.0",
             "enabled": True, "operations": [], "skipped": {}},
            {"name": "beta", "available": True, "reason": None, "hint": None, "version": None,
             "enabled": False, "operations": [], "skipped": {}},
        ],
        "overrides": [],
        "environment": [],
        "legend": {},
    }
    lines = report.render(data).splitlines()
    rows = [line for line in lines if line.startswith(("  alpha", "  beta"))]
    assert len(rows) == 2
    assert rows[0].index("version") == rows[1].index("version")
    assert rows[0].rstrip().endswith("enabled") and rows[1].rstrip().endswith("disabled")
    assert all(len(line) <= report.WIDTH + 10 for line in lines)
    assert "very long reason" not in rows[0]


def test_interpreter_hint_on_cpu_machines():
    r = run_cli("--json")
    assert r.returncode == 0, r.stderr
    triton = next(d for d in json.loads(r.stdout)["dsls"] if d["name"] == "triton")
    if torch.cuda.is_available() or triton["version"] is None:
        pytest.skip("the hint is for a CPU-only machine with triton installed")
    assert "PYTHON_NATIVE_TRITON_INTERPRET=1" in triton["hint"]
    text = run_cli().stdout
    assert "hint: set PYTHON_NATIVE_TRITON_INTERPRET=1" in text and "Legend" in text


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["--help"], "usage: python -m python_native [-h] COMMAND"),
        (["status", "--help"], "usage: python -m python_native status [-h] [--json]"),
        (["demo", "--help"], "usage: python -m python_native demo [-h]"),
    ],
)
def test_help_is_plain_text_with_program_name(capsys, argv, usage):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(usage)
    assert "``" not in out and "\x1b[" not in out  # no reST markup, no terminal colour codes


def test_demo_json_without_a_backend_says_why():
    r = run_cli("demo", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the demo for real")
    assert data["ran"] is False and "PYTHON_NATIVE_TRITON_INTERPRET=1" in data["reason"]


def test_demo_json_runs(capsys):
    if not pn.triton.available:
        pytest.skip(f"triton unavailable: {pn.triton.unavailable_reason}")
    assert demo.main(["--json", "--repeats", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ran"] is True
    assert any(r["op"] == "native_layer_norm" and r["triton"] > 0 for r in data["routed"])
    assert data["max_abs_diff"]["loss"] < 1e-3 and data["median_ms"]["repeats"] == 1


def test_trace_prints_its_events(overrides, x):
    handle = overrides("sub.Tensor", always, marked_sub)
    with pn.trace() as t:
        torch.sub(x, x)
    text = str(t)
    assert repr(t) == text
    assert "sub.Tensor" in text and handle.name in text and "override" in text and "CPU" in text
    with pn.trace() as long:
        for _ in range(50):
            torch.sub(x, x)
    text = repr(long)
    assert text.startswith("Trace(50 events)") and "30 more" in text
    assert len(text.splitlines()) < 30
    assert long.table(limit=None).count(handle.name) == 50


def test_report_says_which_calibration_table_is_in_force(calib, tmp_path):
    """None while no table (nor the portable policy's evidence) speaks for this process's device;
    the table's path once one for that device is in the folder PYTHON_NATIVE_CALIBRATION names."""
    from calibration_testing import FAKE_DEVICE, table

    from python_native.features import calibration

    folder = tmp_path / "tables"
    folder.mkdir()
    calib.env(folder)  # an empty folder, and no shipped table (``calib``): no evidence anywhere
    data = report.collect()
    assert data["calibration"]["source"] == f"{calibration.ENV_VAR}={folder}"
    assert data["calibration"]["in_force"] is None
    assert "Calibration" in report.render(data) and "in force here: none" in report.render(data)

    if backend.device_type() == "cuda":
        torch.cuda.init()  # a GPU process has a device once CUDA is initialised
    calib.device(FAKE_DEVICE)  # this process's device, whichever it is, is the table's
    path = folder / "fake.json"
    path.write_text(json.dumps(table()))
    calibration.reset()
    data = report.collect()
    assert data["calibration"]["in_force"] == str(path)
    assert f"in force here: {path}" in report.render(data)
