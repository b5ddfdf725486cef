"""The background builder leaves no process behind: killed (``SIGKILL`` too, or its whole group), it
takes its compilers with it; the next process to start a build clears what a dead one left (its
temporary files, its lock's record) and starts exactly one new build; and the process that started
it reaps it, whether or not that process ever asks for the status.

Like ``test_background_build.py``, each test turns the background build on for its own processes
alone, with a fresh cache folder (the suite turns it off everywhere else: ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


def _environ(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "PYTHON_NATIVE_CACHE_DIR": str(cache),
            "PYTHON_NATIVE_BACKGROUND_BUILD": "1", **extra}


def _start_status(cache: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "python_native", "status", "--json"], env=_environ(cache, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _fronts(procs: list[subprocess.Popen]) -> list[dict]:
    """The ``front`` sections of ``status --json`` processes started together."""
    fronts = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        fronts.append(json.loads(out)["front"])
    return fronts


def _stat(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 on (state, ppid, pgrp, session, ...), None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _group(pgid: int) -> dict[int, str]:
    """The live (not zombie) processes of process group ``pgid`` or session ``pgid``, by name."""
    found = {}
    for name in os.listdir("/proc"):
        fields = _stat(name) if name.isdigit() else None
        if fields and fields[0] != "Z" and pgid in (int(fields[2]), int(fields[3])):
            found[int(name)] = _comm(int(name))
    return found


def _wait_for(check, timeout: float, every: float = 0.2):
    """``check()`` once it is true, or its last (false) value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return found


def _final_note(folder: Path, timeout: float = 900.0) -> dict:
    def final():
        notes = [json.loads(path.read_text() or "{}") for path in folder.glob("*.build")]
        return next((n for n in notes if n.get("state") in ("built", "failed")), None)

    note = _wait_for(final, timeout, every=1.0)
    assert note, f"the build did not finish in {timeout:.0f} s: {[p.read_text()[-3000:] for p in folder.glob('*.log')]}"
    return note


def _hanging_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A compiler that, while its switch file exists, waits on a child of its own (as g++ waits on
    cc1plus), and otherwise fails at once."""
    cxx = tmp_path / "hanging-c++"
    cxx.write_text('#!/bin/sh\nif [ -e "$0.hang" ]; then sleep 600 & wait; fi\necho "fatal: no compiler" >&2\nexit 3\n')
    cxx.chmod(0o755)
    switch = tmp_path / "hanging-c++.hang"
    switch.touch()
    return cxx, switch


def _kill_mid_compile(cache: Path, compiler_process: str, how: str, **extra: str) -> tuple[int, dict[int, str]]:
    """Start the build, wait until ``compiler_process`` runs under the builder, kill the builder
    ``how`` (``SIGKILL``, ``SIGTERM``, or ``group``: ``kill -TERM -- -PGID``), wait for the builder
    to be gone: its pid and the group it left (which must be empty)."""
    (first,) = _fronts([_start_status(cache, **extra)])
    assert first["why"].startswith("building in the background since"), first["why"]
    pid = first["background_build"]["pid"]
    running = _wait_for(lambda: compiler_process in _group(pid).values(), timeout=600)
    assert running, f"no {compiler_process} under the builder: {_group(pid)}"
    if how == "group":
        os.killpg(pid, signal.SIGTERM)
    else:
        os.kill(pid, getattr(signal, how))
    assert _wait_for(lambda: (_stat(pid) or ["Z"])[0] == "Z", timeout=60), "the builder did not end"
    _wait_for(lambda: not _group(pid), timeout=10)
    return pid, _group(pid)


@pytest.mark.slow  # about a minute each: four processes importing torch, with a build that hangs then fails
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "group"])
def test_a_killed_builder_takes_its_compilers_and_the_next_import_recovers(tmp_path, how):
    cache, (cxx, switch) = tmp_path / "cache", _hanging_compiler(tmp_path)
    folder = cache / "front"
    dead, left = _kill_mid_compile(cache, "sleep", how, CXX=str(cxx))
    assert left == {}, f"the killed builder's compilers outlived it: {left}"
    stale = list(folder.glob(".*.tmp"))
    assert bool(stale) == (how == "SIGKILL"), stale  # a stopped builder removes its own; a killed one cannot
    switch.unlink()
    fronts = _fronts([_start_status(cache, CXX=str(cxx)) for _ in range(3)])  # three at once: one new builder
    started = [f["background_build"] for f in fronts if f["background_build"] is not None]
    assert len(started) == 1 and started[0]["pid"] != dead, [f["why"] for f in fronts]
    assert _final_note(folder, timeout=300)["state"] == "failed"  # this compiler fails once it does not hang
    assert not list(folder.glob(".*.tmp")), list(folder.glob(".*.tmp"))
    log = next(folder.glob("*.log")).read_text()
    if how == "SIGKILL":
        assert f"the builder before this one (pid {dead}) died mid-build" in log and "removed 1 temporary" in log, log
    assert _wait_for(lambda: not _group(started[0]["pid"]), timeout=30), _group(started[0]["pid"])  # its guard too


@pytest.mark.slow  # compiles the front twice (once cut short) in a fresh cache
def test_a_builder_killed_in_cc1plus_leaves_none_and_the_next_import_builds_the_front(tmp_path):
    cache = tmp_path / "cache"
    folder = cache / "front"
    dead, left = _kill_mid_compile(cache, "cc1plus", "SIGKILL")
    assert left == {}, f"the killed builder's compilers outlived it: {left}"
    assert list(folder.glob(".*.tmp"))
    fronts = _fronts([_start_status(cache) for _ in range(3)])
    started = [f["background_build"] for f in fronts if f["background_build"] is not None]
    assert len(started) == 1 and started[0]["pid"] != dead, [f["why"] for f in fronts]
    note = _final_note(folder)
    assert note["state"] == "built", [p.read_text()[-3000:] for p in folder.glob("*.log")]
    assert not list(folder.glob(".*.tmp")), list(folder.glob(".*.tmp"))
    (after,) = _fronts([_start_status(cache)])
    assert after["front"] == "compiled" and "cached build" in after["why"], after


def _children(pid: int) -> dict[int, str]:
    """The children of ``pid`` by state (``Z``: a zombie)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found[int(child)] = (_stat(child) or ["gone"])[0]
    return found


@pytest.mark.slow  # half a minute: an importer and a build that fails
def test_an_importer_that_never_asks_for_the_status_keeps_no_zombie(tmp_path):
    cache, broken = tmp_path / "cache", tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'fatal: this compiler is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    code = "import sys, time, torch, python_native; print('imported', flush=True); time.sleep(600)"
    importer = subprocess.Popen([sys.executable, "-c", code], env=_environ(cache, CXX=str(broken)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert importer.stdout.readline().strip() == "imported", importer.stderr.read()[-3000:]
        assert _final_note(cache / "front", timeout=300)["state"] == "failed"  # the builder is done
        assert _wait_for(lambda: set(_children(importer.pid).values()) <= {"Z"}, timeout=60), "the builder lives on"
        reaped = _wait_for(lambda: "Z" not in _children(importer.pid).values(), timeout=15)
        assert reaped, f"the importer keeps a zombie child: {_children(importer.pid)}"
        assert importer.poll() is None  # still running: it never asked for the status
    finally:
        importer.kill()
        importer.communicate()
