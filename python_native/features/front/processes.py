"""The background builder's processes: none outlives it, a dead one's leftovers are cleared, none is a zombie.

The builder is a session and process group of its own (``posix_spawn(setsid=True)``), and its
compilers stay in that group, so ``kill -- -PGID`` takes all of them. Beyond that:

* A *guard* joins the group: a small process reading a pipe whose write end only the builder holds.
  However the builder ends (``SIGKILL`` too, which no handler sees), the pipe reads end-of-file and
  the guard kills the whole group, itself last: the compiler driver and every ``cc1plus``, ``as``
  and ``ld`` under it. Unlike ``PR_SET_PDEATHSIG`` (set on one child, not inherited by its own
  children, and racing the parent's death), this reaches the compiler's children and has no window.
* ``SIGTERM``, ``SIGINT`` and ``SIGHUP`` stop the builder as an exception (``Stopped``): the running
  compiler is killed and its temporary output removed on the way out, then the guard clears the rest.
* The lock file records the builder holding it: pid, start time (``/proc/PID/stat`` field 22) and boot
  id, so a reused pid is not taken for it. The next builder to hold the lock reads the record: one
  that is gone died mid-build, so what is left of its group is killed; and any temporary file beside
  the library is a dead build's (only the lock's holder writes them), so it is removed. A builder that
  finishes clears its record.

The starting process reaps its builder with a daemon thread waiting on that one pid (never on another
child; no ``SIGCHLD`` handler), so a process that never asks for the status keeps no zombie.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
# The guard: end-of-file on descriptor 0 means the builder is gone; then the group goes too.
_GUARD = "import os, signal\ntry:\n    while os.read(0, 1):\n        pass\nfinally:\n    os.killpg(0, signal.SIGKILL)\n"
_guard_pipe: int | None = None  # the builder's end: open for as long as the builder lives


class Stopped(BaseException):
    """The builder was asked to stop by ``signum`` (not an ``Exception``: no build failure to note)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def guard_group(lock: int) -> int:
    """In the builder: keep the lock on descriptor ``lock`` from its children, and start the guard
    (see the module docstring): from now on the group dies with this process. Returns the guard's pid."""
    global _guard_pipe
    os.set_inheritable(lock, False)  # a compiler never holds the build lock past the builder
    read, write = os.pipe()  # neither end inheritable: the compilers never hold the guard's pipe
    try:
        pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", _GUARD], dict(os.environ),
                             file_actions=[(os.POSIX_SPAWN_DUP2, read, 0)])
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    _guard_pipe = write
    return pid


def stop_on_signals() -> None:
    """In the builder: ``SIGTERM``, ``SIGINT`` and ``SIGHUP`` raise ``Stopped`` (once; later ones are
    ignored, so the way out is not cut short)."""

    def stop(signum: int, _frame: object) -> None:
        for name in STOP_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        raise Stopped(signum)

    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), stop)


def _stat(pid: int | str) -> list[bytes] | None:
    """``/proc/PID/stat`` from field 3 (state) on; None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def _boot() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start(fields: list[bytes] | None) -> int | None:
    return int(fields[19]) if fields is not None and len(fields) > 19 else None  # field 22: start time


def record(lock: int) -> None:
    """Record this process in the lock file on descriptor ``lock`` as the builder holding it."""
    me = {"pid": os.getpid(), "start": _start(_stat(os.getpid())), "boot": _boot()}
    os.ftruncate(lock, 0)
    os.pwrite(lock, json.dumps(me).encode(), 0)


def clear(lock: int) -> None:
    """The build ended (built or failed): nothing of it is left to clear."""
    with contextlib.suppress(OSError):
        os.ftruncate(lock, 0)


def recorded(lock: int) -> dict | None:
    """The builder recorded in the lock file on ``lock`` (None when none is)."""
    try:
        found = json.loads(os.pread(lock, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("pid"), int) else None


def _is_alive(builder: dict) -> bool:
    fields = _stat(builder["pid"])
    return (fields is not None and fields[0] != b"Z" and builder.get("boot") == _boot()
            and _start(fields) == builder.get("start"))


def leftovers(builder: dict) -> list[int]:
    """The processes left in a dead builder's group: same boot, same user, started after it. None
    when its pid is in use again (its group is then another's) or there is no /proc."""
    pid, start, it = builder["pid"], builder.get("start"), _stat(builder["pid"])
    if _boot() is None or builder.get("boot") != _boot() or not isinstance(start, int):
        return []
    if it is not None and not (it[0] == b"Z" and _start(it) == start):
        return []  # the kernel reuses no pid still naming a group: while it is free, group ``pid`` is the builder's
    found = []
    for name in os.listdir("/proc"):
        fields = _stat(name) if name.isdigit() else None
        with contextlib.suppress(OSError, ValueError, IndexError):
            if (fields is not None and int(fields[2]) == pid and int(fields[3]) == pid and fields[0] != b"Z"
                    and os.stat(f"/proc/{name}").st_uid == os.getuid() and (_start(fields) or -1) >= start):
                found.append(int(name))
    return found


def temporaries(library: Path) -> list[Path]:
    """The temporary files beside ``library`` that its builds write (library, manifest, note)."""
    prefix = f".{library.name.split('.')[0]}."
    with contextlib.suppress(OSError):
        return sorted(p for p in library.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(".tmp"))
    return []


def recover(lock: int, library: Path) -> str | None:
    """In a builder that holds the lock on ``lock``: kill what is left of a builder that died holding
    it, remove the temporary files a dead build left beside ``library``, record this builder. Says
    what it cleared (None when nothing)."""
    before = recorded(lock)
    killed = [] if before is None or _is_alive(before) else leftovers(before)
    for pid in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    removed = temporaries(library)  # the lock's holder alone writes them: none is a live build's
    for path in removed:
        with contextlib.suppress(OSError):
            os.unlink(path)
    record(lock)
    if not killed and not removed:
        return None
    dead = f"the builder before this one (pid {before['pid']}) died mid-build" if before else "a build died"
    return f"{dead}: killed {len(killed)} process(es) it left, removed {len(removed)} temporary file(s)"


def reap(pid: int, ended: Callable[[int | None], None]) -> None:
    """Wait for the child ``pid`` on a daemon thread (for it alone), then call ``ended`` with its exit
    code, or None when something else reaped it first."""
    import threading

    def wait() -> None:
        try:
            code: int | None = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except ChildProcessError:
            code = None
        ended(code)

    threading.Thread(target=wait, name=f"python-native builder {pid}", daemon=True).start()
