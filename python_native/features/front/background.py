"""The compiled front without asking: the first process that finds none has it built in the background.

``import torch`` never compiles. Where no build for this torch, compiler and source is cached, the
importing process starts a builder and goes on with the Python routers; every process started after
the build finished loads the compiled front. The builder is a separate, detached process (its own
session, niceness 19, its output in ``<library>.log`` beside the library) that builds exactly what
``python -m python_native precompile`` builds, under the same trust rules, and exits. One builder at
a time: the importing process takes the build lock without waiting and hands it to the builder (a
process that finds the lock taken starts nothing), so eight ranks starting at once start one build.

Nothing starts where the user said no: ``PYTHON_NATIVE_DISABLE=1``, ``PYTHON_NATIVE_FRONT=python``,
``PYTHON_NATIVE_BACKGROUND_BUILD=0`` (the test suite sets it), a machine without a C++ compiler
(the status report says so in one line), or a build that failed for this key before (``precompile``
shows the compiler's output and retries). The builder notes its state in ``<library>.build`` (a
small JSON file written under the trust rules), which the status report of every process reads.

No process of a build outlives the builder, a builder that died is cleaned up after by the next, and
the starting process reaps its builder whether or not it asks for the status (``processes``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from python_native.features.front import build, processes
from python_native.foundations import env, faults, safe_write, trust

FAULT_SOURCE = "compiled front"
PRECOMPILE = "python -m python_native precompile"
_WAITING = "the Python routers serve until a later process loads it"


@dataclass
class _Builder:
    """The builder this process started."""

    pid: int
    since: float
    library: Path
    where: build.Place
    exit_code: int | None = None
    finished: float | None = None

    @property
    def log(self) -> Path:
        return log_path(self.library)

    def ended(self, code: int | None) -> None:
        """The builder exited with ``code`` (None: reaped by someone else; its note says how it went)."""
        if code is None:
            code = 0 if read_state(self.library, self.where).get("state") == "built" else 1
        self.finished = time.time()
        self.exit_code = code


_started: _Builder | None = None


def state_path(library: Path) -> Path:
    """The builder's note beside the library: building, built or failed, and when."""
    return library.with_suffix(".build")


def log_path(library: Path) -> Path:
    return library.with_suffix(".log")


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def report_untrusted(problem: trust.Untrusted, meanwhile: str) -> None:
    """Name an artefact or folder of the front that is not loaded, once, with the fix."""
    faults.report(FAULT_SOURCE, f"not loaded from {problem.path}: {problem.why}", f"{problem.remedy}; {meanwhile}",
                  stacklevel=4)


def find_or_start() -> tuple[ModuleType | None, Path | None, str]:
    """``(module, library, why)``: the cached front that passes every check, or None and why not,
    with a background build started where one helps. Exceptions of the loader itself propagate."""
    try:
        where = build.place()
    except trust.Untrusted as e:
        report_untrusted(e, "the Python routers serve (no private cache folder passes the checks either)")
        return None, None, "no cache folder passes the trust checks (see problems); the Python routers serve"
    if where.refused is not None:
        report_untrusted(where.refused, f"the compiled front is loaded from and built into {where.folder} instead")
    library = where.folder / build.library_name()
    try:
        module, library = build.load_cached(where)
    except trust.Untrusted as e:
        report_untrusted(e, "the Python routers serve; a fresh build replaces it")
        module = None
    if module is not None:
        return module, library, "a cached build for this torch, compiler and source"
    return None, library, start_build(where, library)


def start_build(where: build.Place, library: Path) -> str:
    """Start the builder unless a switch, the machine or an earlier failure says not to; returns
    the status line that says what happened."""
    if not env.background_build_allowed():
        return (f"no build for this torch and compiler yet; the Python routers serve. Build it once with "
                f"`{PRECOMPILE}` ({env.BACKGROUND_BUILD[0]}=0 keeps it from being built in the background)")
    if not hasattr(os, "posix_spawn"):
        return f"no build yet (background builds need a POSIX system); the Python routers serve. Build it with `{PRECOMPILE}`"
    if build.compiler() is None:
        return f"no C++ compiler (${build.COMPILER_ENV} or `c++` on PATH) to build the compiled front: the Python routers serve"
    note = read_state(library, where)
    if note.get("state") == "failed":
        return (f"its background build failed at {_clock(note.get('at', 0))} ({note.get('error', '?')}); the Python "
                f"routers serve. `{PRECOMPILE}` shows the compiler's output and retries")
    try:
        trust.make_folder(where.folder, where.root)
        lock = trust.try_lock(build.lock_path(library))
    except OSError as e:
        return f"no build yet, and none can start in {where.folder} ({e}); the Python routers serve. Try `{PRECOMPILE}`"
    if lock is None:
        since = f" since {_clock(note['since'])}" if note.get("state") == "building" and "since" in note else ""
        return f"another process is building it{since}; {_WAITING}"
    try:
        builder = _spawn(lock, library, where)
    except OSError as e:
        return f"no build yet, and the background build could not start ({e}); the Python routers serve. Try `{PRECOMPILE}`"
    finally:
        os.close(lock)  # the builder holds the lock now
    return _building(builder)


def _building(b: _Builder) -> str:
    return f"building in the background since {_clock(b.since)} (pid {b.pid}, log {b.log}); {_WAITING}"


def _spawn(lock: int, library: Path, where: build.Place) -> _Builder:
    """Start the builder: detached (its own session), nice 19, the lock on descriptor 3, output to the log."""
    global _started
    log = log_path(library)
    out = safe_write.open_fresh(log)  # a fresh file of ours renamed into place, never one found there
    copies: list[int] = []
    try:
        copies = [_above_stdio(out), _above_stdio(lock)]  # descriptors 0-3 are rewired in the builder
        environ = {**os.environ, env.FRONT[0]: "python", env.BACKGROUND_BUILD[0]: "0"}
        package_parent = str(Path(__file__).resolve().parents[3])
        if package_parent not in _site_folders():  # found through this process's path only (a checkout)
            environ["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, environ.get("PYTHONPATH")) if p)
        code = ("import os, sys; os.nice(19); os.chdir('/'); "
                "from python_native.features.front import background; sys.exit(background.main(sys.argv[1:]))")
        pid = os.posix_spawn(sys.executable, [sys.executable, "-c", code, str(library)], environ, setsid=True,
                             file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                           (os.POSIX_SPAWN_DUP2, copies[0], 1),
                                           (os.POSIX_SPAWN_DUP2, copies[0], 2),
                                           (os.POSIX_SPAWN_DUP2, copies[1], 3)])
    finally:
        for fd in (out, *copies):
            os.close(fd)
    _started = _Builder(pid, time.time(), library, where)
    processes.reap(pid, _started.ended)  # no zombie, whether or not this process asks for the status
    return _started


def _above_stdio(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 4)


def _site_folders() -> set[str]:
    import site
    import sysconfig

    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    paths.update(getattr(site, "getsitepackages", list)())
    return {os.path.realpath(p) for p in paths}


def progress() -> str | None:
    """What the builder this process started is doing (None when it started none)."""
    b = _started
    if b is None:
        return None
    if b.exit_code is None or b.finished is None:  # its reaper has not seen it exit
        return _building(b)
    if b.exit_code == 0:
        return (f"built in the background in {b.finished - b.since:.0f} s (pid {b.pid}): processes started from now "
                "on load the compiled front; this one keeps the Python routers")
    return (f"the background build failed (exit {b.exit_code}; log {b.log}); the Python routers serve. "
            f"`{PRECOMPILE}` shows the compiler's output and retries")


def describe() -> dict[str, Any] | None:
    """The background build this process started, for ``status --json``: state, pid, since, log."""
    why = progress()
    b = _started
    if b is None or why is None:
        return None
    state = "building" if b.exit_code is None else "built" if b.exit_code == 0 else "failed"
    return {"state": state, "pid": b.pid, "since": _clock(b.since), "log": str(b.log)}


def _forget_in_child() -> None:
    """A forked child did not start the parent's builder (and cannot wait for it)."""
    global _started
    _started = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def read_state(library: Path, where: build.Place) -> dict[str, Any]:
    """The builder's note for ``library`` ({} when there is none, or it fails a check)."""
    try:
        note = json.loads(trust.read_file(state_path(library), where.root))
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def _note(library: Path, **state: Any) -> None:
    trust.write_atomic(state_path(library), json.dumps(state).encode())


def main(argv: list[str]) -> int:
    """The builder: build the front for ``argv[0]`` (the library the starting process expects)
    holding the lock on descriptor 3, note how it went, exit."""
    import fcntl

    library = Path(argv[0])
    try:
        fcntl.flock(3, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: the starting process handed it over
    except OSError as e:
        print(f"the build lock was not handed over ({e}): nothing built", flush=True)
        return 2
    if build.library_path() != library:
        print(f"this process would build {build.library_path()}, not {library}: nothing built", flush=True)
        return 2
    processes.guard_group(3)  # from here on, no compiler outlives this process
    recovered = processes.recover(3, library)
    if recovered:
        print(f"{_clock(time.time())} {recovered}", flush=True)
    _note(library, state="building", pid=os.getpid(), since=time.time())
    print(f"{_clock(time.time())} building the compiled dispatch front: {library}", flush=True)
    processes.stop_on_signals()
    try:
        _, path, cached, seconds = build.build(lock_held=True)
    except processes.Stopped as e:  # not a failure: the next process to start a build starts it again
        print(f"{_clock(time.time())} stopped by signal {e.signum}: nothing built", flush=True)
        return 128 + e.signum
    except Exception as e:  # noted for every later process, which then starts no build
        processes.clear(3)
        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _note(library, state="failed", at=time.time(), error=f"{type(e).__name__}: {first}"[:300], log=str(log_path(library)))
        return 1
    processes.clear(3)
    _note(library, state="built", at=time.time(), seconds=round(seconds, 1))
    print(f"{_clock(time.time())} {'already built' if cached else f'built in {seconds:.0f} s'}: {path}", flush=True)
    return 0
