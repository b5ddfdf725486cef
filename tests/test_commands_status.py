"""The main command shows the product or says the one line that does: where no DSL can run, the
status report ends with what to run, and a trace opened then warns that it will record nothing and why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import python_native as pn
from python_native.core.registry import REGISTRY
from python_native.foundations import dsl_registry
from python_native.panel import snapshot

ROOT = Path(__file__).resolve().parent.parent
SWITCHES = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")
BARE = {k: v for k, v in os.environ.items() if k not in SWITCHES}
BARE["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

cpu_only = pytest.mark.skipif(torch.cuda.is_available() or dsl_registry.version("triton") is None,
                              reason="for a machine without a GPU and with triton installed")


def _snippet() -> str:
    return re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)


@cpu_only
def test_status_without_the_interpreter_ends_with_the_line_to_run():
    proc = subprocess.run([sys.executable, "-m", "python_native"], env=BARE, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("No override can run in this process") and "no GPU here" in last
    assert "PYTHON_NATIVE_TRITON_INTERPRET=1 python -m python_native" in last
    assert "Failed to initialize NumPy" not in proc.stderr


@cpu_only
def test_the_readme_snippet_says_why_its_trace_is_empty(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import python_native\n" + _snippet()], env=BARE, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "this trace will record no override" in line]
    assert len(warned) == 1 and "PYTHON_NATIVE_TRITON_INTERPRET=1" in warned[0], proc.stderr


def test_a_trace_where_overrides_run_warns_nothing():
    if not any(o.active for o in pn.overrides() if o.dsl == "triton"):
        pytest.skip("no Triton override active here")
    assert snapshot.no_override_reason() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pn.trace():
            pass


def test_without_triton_installed_the_line_is_the_install(monkeypatch):
    monkeypatch.setattr(REGISTRY, "overrides", lambda: [])
    real = dsl_registry.version
    monkeypatch.setattr(dsl_registry, "version", lambda name: None if name == "triton" else real(name))
    why = snapshot.no_override_reason()
    assert why.startswith("triton is not installed: pip install 'python-native[triton]'"), why
    assert ("PYTHON_NATIVE_TRITON_INTERPRET=1" in why) == (not torch.cuda.is_available())
    with pytest.warns(UserWarning, match=r"this trace will record no override: triton is not installed"):
        pn.trace()


def test_the_switched_off_case_is_named(monkeypatch):
    monkeypatch.setattr(REGISTRY, "overrides", lambda: [])
    monkeypatch.setenv("PYTHON_NATIVE_DISABLE", "1")
    assert snapshot.no_override_reason() == "PYTHON_NATIVE_DISABLE=1 turns every override off for this process"
