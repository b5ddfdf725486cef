"""Switches read at import and changed afterwards (in a notebook, say): honoured on the panel's first use,
or refused loudly, once; the status never claims a DSL is available with nothing installed and no why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SWITCHES = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET", "PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT")
# A process with none of the switches set; the checkout under test first on the path.
BARE = {k: v for k, v in os.environ.items() if k not in SWITCHES}
BARE["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

cpu_build_only = pytest.mark.skipif(
    torch.backends.cuda.is_built(), reason="a CUDA build installs the Triton overrides at import, at the CUDA key"
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], env={**BARE, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


LATE_INTERPRETER = """
import os, json, torch
import torch.backends.python_native as pn
before = {"available": "triton" in pn.available_dsls, "ops": pn.get_dsl_operations("triton")}
os.environ["PYTHON_NATIVE_TRITON_INTERPRET"] = "1"
after = {"available": "triton" in pn.available_dsls, "ops": pn.get_dsl_operations("triton")}
with pn.trace() as t:
    torch.softmax(torch.randn(4, 8), -1)
print(json.dumps({"before": before, "after": after, "events": [(e.op, e.outcome, e.dsl) for e in t.events]}))
"""


@cpu_build_only
def test_interpreter_switch_set_after_import_takes_effect_on_first_use():
    out = json.loads(_python(LATE_INTERPRETER).stdout.splitlines()[-1])
    assert out["before"] == {"available": False, "ops": []}
    assert out["after"]["available"] and "_softmax" in out["after"]["ops"]
    assert ["_softmax", "override", "triton"] in out["events"]


MOVED_INTERPRETER = """
import os, torch
import torch.backends.python_native as pn
assert pn.get_dsl_operations("triton")
for name in ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET"):
    os.environ.pop(name)
pn.available_dsls; pn.status(); pn.overrides()
note = next(d["note"] for d in pn.status()["dsls"] if d["name"] == "triton")
print("NOTE", note)
"""


@cpu_build_only
def test_a_change_that_cannot_take_effect_warns_once_and_the_status_says_why():
    proc = _python(MOVED_INTERPRETER, PYTHON_NATIVE_TRITON_INTERPRET="1")
    warned = [line for line in proc.stderr.splitlines() if "UserWarning" in line]
    assert len(warned) == 1, proc.stderr
    assert "PYTHON_NATIVE_TRITON_INTERPRET was unset after the Triton overrides were installed at CPU" in warned[0]
    assert "before `import torch`" in warned[0]
    assert "NOTE PYTHON_NATIVE_TRITON_INTERPRET was unset" in proc.stdout


LATE_DISABLE = """
import os, torch
import torch.backends.python_native as pn
os.environ["PYTHON_NATIVE_DISABLE"] = "1"
pn.available_dsls; pn.status(); pn.available_dsls
"""


def test_the_process_wide_off_switch_set_after_import_warns_once():
    proc = _python(LATE_DISABLE, PYTHON_NATIVE_TRITON_INTERPRET="1")
    warned = [line for line in proc.stderr.splitlines() if "UserWarning" in line]
    assert len(warned) == 1 and "PYTHON_NATIVE_DISABLE was set after torch imported python_native" in warned[0]


DISABLED_STATUS = """
import json, torch
import torch.backends.python_native as pn
triton = next(d for d in pn.status()["dsls"] if d["name"] == "triton")
print(json.dumps({"available": "triton" in pn.available_dsls, "ops": triton["operations"], "note": triton["note"]}))
"""


def test_an_available_dsl_with_nothing_installed_says_why():
    proc = _python(DISABLED_STATUS, PYTHON_NATIVE_TRITON_INTERPRET="1", PYTHON_NATIVE_DISABLE="1")
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["available"] and out["ops"] == []
    assert "PYTHON_NATIVE_DISABLE" in out["note"]
    report = subprocess.run([sys.executable, "-m", "python_native"], env={**BARE, "PYTHON_NATIVE_TRITON_INTERPRET": "1",
                            "PYTHON_NATIVE_DISABLE": "1"}, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "note: no override installed: PYTHON_NATIVE_DISABLE" in report.stdout
