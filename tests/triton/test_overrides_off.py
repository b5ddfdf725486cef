"""``--overrides-off`` (tests/conftest.py): under ``PYTHON_NATIVE_DISABLE=1`` a test marked
``override`` must fail, a marked test that passes fails the run, and an unmarked test runs as
usual; without the variable the option is refused, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton_testing import requires_triton

pytestmark = requires_triton

ROOT = Path(__file__).resolve().parents[2]
MARKED = "tests/triton/test_softmax.py::test_switches_turn_the_override_off"
UNMARKED = "tests/triton/test_softmax.py::test_reduced_rows_views"
# A plugin that marks the unmarked test, before tests/conftest.py turns marks into expected failures.
MARK_IT = f"""
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid == {UNMARKED!r}:
            item.add_marker(pytest.mark.override)
"""


def _pytest(tmp_path: Path, *args: str, disable: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    if disable:
        env["PYTHON_NATIVE_DISABLE"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two pytest processes, each importing torch
def test_marked_tests_must_fail_and_unmarked_ones_pass(tmp_path):
    r = _pytest(tmp_path, MARKED, UNMARKED, "--overrides-off")
    assert r.returncode == 0 and "1 passed, 1 xfailed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    (tmp_path / "mark_it.py").write_text(MARK_IT)
    r = _pytest(tmp_path, UNMARKED, "--overrides-off", "-p", "mark_it")
    assert r.returncode == 1 and "XPASS(strict)" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def test_the_option_is_refused_with_the_overrides_on(tmp_path):
    r = _pytest(tmp_path, UNMARKED, "--overrides-off", disable=False)
    assert r.returncode == 4, r.stdout[-3000:] + r.stderr[-2000:]
    assert "set PYTHON_NATIVE_DISABLE=1" in r.stderr, r.stderr[-2000:]
