"""The compiled front without asking: the first process that finds none starts its build in the
background, and every process after the build loads it; the switches, a machine without a compiler
and a build that failed start nothing, and the status report says which applies.

Each test gives its processes a fresh cache folder and turns the background build on for them
alone (the suite turns it off everywhere else: ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from python_native.foundations import env


def _start_status(cache: Path, **extra: str) -> subprocess.Popen:
    environ = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "PYTHON_NATIVE_CACHE_DIR": str(cache),
               "PYTHON_NATIVE_BACKGROUND_BUILD": "1", **extra}
    return subprocess.Popen([sys.executable, "-m", "python_native", "status", "--json"], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _status(cache: Path, **extra: str) -> dict:
    """``status --json`` of a fresh process using ``cache``; its ``front`` section and problems."""
    proc = _start_status(cache, **extra)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def _note(cache: Path, timeout: float = 900.0) -> dict:
    """The builder's note once it says built or failed (waiting up to ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (cache / "front").glob("*.build"):
            note = json.loads(path.read_text() or "{}")
            if note.get("state") in ("built", "failed"):
                return note
        time.sleep(2)
    logs = [p.read_text()[-3000:] for p in (cache / "front").glob("*.log")]
    pytest.fail(f"the background build did not finish in {timeout:.0f} s; its log: {logs}")


@pytest.mark.slow
def test_a_first_process_builds_the_front_in_the_background_and_the_next_ones_load_it(tmp_path):
    cache = tmp_path / "cache"
    firsts = [_start_status(cache) for _ in range(3)]  # three processes at once: one builder
    reports = []
    for proc in firsts:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out)["front"])
    started = [r for r in reports if r["background_build"] is not None]
    assert len(started) == 1, [r["why"] for r in reports]
    builder = started[0]["background_build"]
    assert started[0]["front"] == "python" and builder["state"] == "building"  # import torch did not wait
    assert started[0]["why"].startswith("building in the background since")
    others = [r["why"] for r in reports if r is not started[0]]
    assert all("another process is building it" in why or "cached build" in why for why in others), others
    try:  # the importing processes have exited; the builder lives on, at low priority
        assert os.getpriority(os.PRIO_PROCESS, builder["pid"]) == 19
    except ProcessLookupError:
        pass  # already done
    note = _note(cache)
    assert note["state"] == "built", (note, [p.read_text()[-3000:] for p in (cache / "front").glob("*.log")])
    second = _status(cache)
    assert second["front"]["front"] == "compiled", second["front"]
    assert "cached build" in second["front"]["why"] and second["front"]["background_build"] is None
    assert not [p for p in second["problems"] if p["source"] == "compiled front"], second["problems"]


def _broken_compiler(tmp_path: Path) -> Path:
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'fatal: this compiler is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    return broken


@pytest.mark.slow
def test_a_failed_build_is_said_with_its_log_and_not_retried(tmp_path):
    cache, cxx = tmp_path / "cache", _broken_compiler(tmp_path)
    first = _status(cache, CXX=str(cxx))["front"]
    assert first["why"].startswith("building in the background since")
    note = _note(cache, timeout=600)
    assert note["state"] == "failed" and "this compiler is broken" in Path(note["log"]).read_text()
    second = _status(cache, CXX=str(cxx))["front"]
    assert second["front"] == "python" and second["background_build"] is None
    assert "background build failed" in second["why"] and "precompile" in second["why"], second["why"]


@pytest.mark.slow
def test_a_machine_without_a_compiler_keeps_the_python_routers_with_one_line(tmp_path):
    info = _status(tmp_path / "cache", CXX=str(tmp_path / "no-such-c++"))["front"]
    assert info["front"] == "python" and info["background_build"] is None
    assert info["why"].startswith("no C++ compiler") and "Python routers" in info["why"] and "\n" not in info["why"]
    assert not (tmp_path / "cache" / "front").exists()


@pytest.mark.slow
@pytest.mark.parametrize("switch", [("PYTHON_NATIVE_DISABLE", "1"), ("PYTHON_NATIVE_FRONT", "python"),
                                    ("PYTHON_NATIVE_BACKGROUND_BUILD", "0")], ids=lambda s: f"{s[0]}={s[1]}")
def test_the_switches_start_no_build(tmp_path, switch):
    name, value = switch
    info = _status(tmp_path / "cache", **{name: value})["front"]
    assert info["front"] == "python" and info["background_build"] is None
    assert name in info["why"], info["why"]
    assert not (tmp_path / "cache" / "front").exists()


def test_the_test_suite_itself_starts_no_background_build():
    assert not env.background_build_allowed()
