"""Every environment variable read right: each read as the library that reads it too reads it, and
no value of any (empty, a word, -1, 100,000 characters, unicode, padded with spaces) costs more than
one line on stderr, fails a call or hides from ``pn.status()``'s problems.

Each value is tried in fresh processes (``import torch``, a call through an overridden op,
``pn.status()``), many variables at a time. Left out there: ``TORCH_LOGS`` and torch's ordering
variable, on whose bad values torch itself fails ``import torch``; their readings are checked
against torch's own below.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from python_native.foundations import env, env_rules

ROOT = Path(__file__).resolve().parent.parent
NAMES = [name for names, _ in env.SWITCHES for name in names]
TORCH_REFUSES = ("TORCH_LOGS", "TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN")
FUZZED = [name for name in NAMES if name not in TORCH_REFUSES]
HUGE = "x" * 100_000
VALUES = {"empty": "", "word": "word", "minus one": "-1", "huge": HUGE, "unicode": "é\u200b日本", "padded": None}
VALID = {"PYTHON_NATIVE_ORDER_FN": "fuzz_order.keep", "PYTHON_NATIVE_FRONT": "python", "CUTE_DSL_ARCH": "sm_90a",
         "PYTHON_NATIVE_VARIANTS": "softmax=default", "PYTHON_NATIVE_CALIBRATION": "off", "CXX": "c++",
         "PYTHON_NATIVE_BACKGROUND_BUILD": "0", "PYTHON_NATIVE_DISABLE": "0", "TORCH_DISABLE_NATIVE_JIT": "0"}
PATHS = {"PYTHON_NATIVE_DUMP_DIR", "PYTHON_NATIVE_CACHE_DIR", "XDG_CACHE_HOME"}
SOURCE = """
import json, torch, warnings
warnings.filterwarnings("ignore", "python_native: this trace will record no override")  # no GPU, no interpreter
import torch.backends.python_native as pn
x = torch.randn(4, 8)
with pn.trace() as t:
    y = torch.softmax(x, -1)
assert torch.allclose(y, torch.softmax(x.double(), -1).float(), atol=1e-5)
s = pn.status()
print("RESULT " + json.dumps({"problems": [p["source"] for p in s["problems"]],
                              "triton": any(e.dsl == "triton" for e in t.events)}))
"""


def _value(name: str, kind: str, folder: Path) -> str:
    valid = str(folder / name.lower()) if name in PATHS else VALID.get(name, "1")
    return f"  {valid}  " if VALUES[kind] is None else VALUES[kind]


def _bad(name: str, value: str) -> bool:
    """Whether ``value`` is one ``name``'s reader must name among the problems."""
    rule = env.RULES[name]
    if rule == "flag":
        return value.strip().lower() not in env_rules.TRUTHY | env_rules.FALSY
    if rule == "torch flag":
        return value.strip() not in ("0", "1")
    if rule == "Triton flag":
        return value.lower() not in env_rules.TRUTHY | env_rules.FALSY
    if rule in ("CuTe DSL text", "XDG path") or name == "CXX":
        return value != VALID.get(name) and (value != "" or rule != "XDG path")
    if rule == "path":
        return len(value) > 4096
    return value.strip() != "" and value.strip() != VALID.get(name, "1")


def _run(values: dict[str, str], folder: Path, **extra: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in NAMES and not k.startswith(env.PREFIX)}
    environ = {**base, "HOME": str(folder), "PYTHON_NATIVE_BACKGROUND_BUILD": "0", **extra, **values,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    (folder / "fuzz_order.py").write_text("def keep(op, key, overrides):\n    return overrides\n")
    proc = subprocess.run([sys.executable, "-c", SOURCE], env=environ, cwd=folder, capture_output=True, text=True,
                          timeout=600)
    shown = proc.stderr[-3000:]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, shown
    bad = [name for name, value in values.items() if _bad(name, value)]
    assert len(proc.stderr.splitlines()) <= len(bad), shown  # one line a bad value, at most
    assert len(proc.stderr) < 400 * max(len(bad), 1), shown  # each cut short
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    ours = {**extra, **values}.get("PYTHON_NATIVE_TRITON_INTERPRET", "").strip().lower() in env_rules.TRUTHY
    named = [n for n in bad if not (ours and n == "TRITON_INTERPRET")]  # our switch turned Triton's on: fixed
    assert set(named) <= set(result["problems"]), (named, result["problems"], shown)
    return result


def test_triton_interpret_is_read_as_triton_reads_it(tmp_path):
    """``TRITON_INTERPRET='  1  '`` is off for Triton: no override installs at the CPU key (a call
    through one would find no driver); with our own switch on, Triton's is turned on for it."""
    assert _run({"TRITON_INTERPRET": "  1  "}, tmp_path)["triton"] is False
    both = {"TRITON_INTERPRET": "  1  ", "PYTHON_NATIVE_TRITON_INTERPRET": "  1  ", "PYTHON_NATIVE_CALIBRATION": HUGE}
    assert _run(both, tmp_path)["triton"] is True


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(VALUES))
def test_every_variable_takes_any_value(kind, tmp_path):
    batches = [FUZZED[i::3] for i in range(3)] if kind == "huge" else [FUZZED]  # the environment's size limit
    for batch in batches:
        _run({name: _value(name, kind, tmp_path) for name in batch}, tmp_path)


def test_shown_values_are_cut_short():
    assert env_rules.shown("abc") == "'abc'"
    assert env_rules.shown(HUGE) == repr("x" * 60) + "…(100000 characters)"
    assert env_rules.cut(HUGE) == "x" * 60 + "…(100000 characters)"


@pytest.mark.parametrize("value", ["", "1", " 1 ", "0", "01", "+1", "true", "word", "-1", "2", "١"])
def test_torch_switches_read_as_torch_reads_them(monkeypatch, value):
    from torch._native import common_utils

    monkeypatch.setenv("TORCH_DISABLE_NATIVE_JIT", value)
    common_utils.check_native_jit_disabled.cache_clear()
    try:
        theirs = common_utils.check_native_jit_disabled()
    except ValueError:
        theirs = False
    assert env_rules.torch_flag("TORCH_DISABLE_NATIVE_JIT", value) is theirs
    common_utils.check_native_jit_disabled.cache_clear()


@pytest.mark.parametrize("value", ["", "1", " 1 ", "  1  ", "true", "TRUE", "yes", "On", "0", "off", "word", "-1", "é"])
def test_triton_interpret_read_as_triton_reads_it(monkeypatch, value):
    from triton._C.libtriton import getenv_bool

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert env_rules.triton_flag("TRITON_INTERPRET", value) is getenv_bool("TRITON_INTERPRET", False)


@pytest.mark.parametrize("value", ["", "+python_native", "+python_native, dynamo", " +python_native",
                                   "python_native ,dynamo", "word", "-1", "é", "a,,b"])
def test_torch_logs_read_as_torch_reads_it(monkeypatch, value):
    from torch._logging import _internal

    monkeypatch.setenv("TORCH_LOGS", value)
    ours = env.torch_logs()
    accepted = value != "" and _internal._validate_settings(value)
    assert (ours != "") == accepted
    if accepted:
        assert ours == re.sub(r"\s+", "", value)


def test_every_variable_is_in_the_docs_table():
    page = (ROOT / "docs" / "environment.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \|", page, re.M)
    assert sorted(rows) == sorted(NAMES) and len(rows) == len(set(rows))
