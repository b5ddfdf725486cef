"""A bad calibration table disables only itself: every override stays installed, the status report
names the file, what is wrong and the fix, and never raises (issue 23, item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import python_native as pn

# isort: split
from calibration_testing import recorded_registration, table

import python_native_dsls.triton as backend
from python_native.features import calibration
from python_native.tools import report

BAD = {
    "a JSON array": ("[]", "a JSON object is needed, got a JSON array"),
    "null": ("null", "a JSON object is needed, got null"),
    "a string": ('"x"', 'a JSON object is needed, got "x" (a string)'),
    "unhashable op": (json.dumps(table("cpu", [{"op": ["_softmax"], "dtype": "float32", "bucket": 3, "wins": True}])),
                      "row 0: 'op' must be a non-empty string, got a JSON array"),
    "unhashable dtype": (json.dumps(table("cpu", [{"op": "_softmax", "dtype": {"a": 1}, "bucket": 3, "wins": True}])),
                         "row 0: 'dtype' must be a non-empty string, got a JSON object"),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "deep nesting in a row": (json.dumps(table("cpu", [{"op": "_softmax", "dtype": "float32", "bucket": 3, "wins": True,
                                                        "shape": [[[[[[1]]]]]]}])),
                              "row 0: 'shape' must be an array of non-negative integers"),
    "wins as a string": (json.dumps(table("cpu", [{"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": "false"}])),
                         "row 0: 'wins' must be true or false (a JSON boolean), got \"false\" (a string)"),
    "a boolean bucket": (json.dumps(table("cpu", [{"op": "_softmax", "dtype": "float32", "bucket": True, "wins": True}])),
                         "row 0: bucket true (a boolean) is not an integer in 0..64"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_table_is_skipped_every_override_stays_and_status_names_it(calib, monkeypatch, case):
    from python_native_dsls.triton.ops import all_overrides

    content, reason = BAD[case]
    path = calib.shipped.parent / "bad.json"
    path.write_text(content)
    calib.env(path)
    calib.device("cpu")
    recorded = recorded_registration(monkeypatch)
    backend.register_overrides()
    assert set(recorded) == {spec.op for spec in all_overrides()}  # none dropped
    assert calibration.wins("_softmax", "float32", 9, "cpu") is None  # nothing gates: the conds decide
    data = pn.status()  # never raises
    [skipped] = data["calibration"]["skipped"]
    assert skipped["path"] == str(path) and reason in skipped["reason"], skipped
    assert calibration.ENV_VAR in skipped["fix"]
    text = report.render(data)
    assert str(path) in text and reason.split(",")[0] in " ".join(text.split())


def test_a_table_for_another_device_named_by_the_variable_leaves_nothing_out_here(calib, monkeypatch):
    """Named by PYTHON_NATIVE_CALIBRATION, a table for another GPU where gelu always lost: on this
    device (the interpreter's cpu) gelu is installed, and status says no table is in force here."""
    from python_native_dsls.triton.ops import all_overrides

    path = calib.shipped.parent / "other.json"
    path.write_text(json.dumps(table("Other GPU/sm80", [
        {"op": "gelu", "dtype": "float32", "bucket": b, "wins": False} for b in (14, 20, 26)])))
    calib.env(path)
    calib.device("cpu")
    recorded = recorded_registration(monkeypatch)
    backend.register_overrides()
    assert "gelu" in recorded and set(recorded) == {spec.op for spec in all_overrides()}
    assert calibration.never_wins("gelu", dispatch_key="CPU") is False
    info = calibration.describe()
    assert info["in_force"] is None and "in force here: none" in "\n".join(report.calibration_lines(info))
    assert [t["use"] for t in info["tables"] if t["path"] == str(path)] == ["for a device not seen here"]


@pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
def test_status_command_with_a_bad_table_names_it_and_keeps_every_override(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[]")
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    clean = subprocess.run([sys.executable, "-m", "python_native", "status", "--json"], env=env,
                           capture_output=True, text=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "python_native", "status"], env={**env, calibration.ENV_VAR: str(path)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert f"skipped {path}" in text and "a JSON object is needed, got a JSON array" in text and "fix:" in text
    installed = len(json.loads(clean.stdout)["overrides"])
    assert installed > 0 and f"Overrides ({installed})" in out.stdout
