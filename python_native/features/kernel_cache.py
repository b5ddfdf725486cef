"""On-disk cache of compiled kernels, shared by processes and DSLs.

A compiled kernel costs seconds to build and milliseconds to load, so each build is stored once
under a key that names everything the binary depends on: the kernel and its specialization, the
target architecture, the versions of the DSL compiler, torch and python-native, and a hash of the
kernel's source. Any change to one of them gives another file name, so stale binaries are never
looked up.

Each entry is one file: a magic line, a JSON header (the full key, the payload length and its
SHA-256) and the payload. An entry whose magic, key, length or checksum does not match is treated
as absent: it is removed and rebuilt, never loaded. Writers take an ``fcntl`` lock per entry
(so concurrent processes build a kernel once), write to a temporary file and ``os.replace`` it,
so readers see a whole entry or none.

Anything found at an entry's path that is not a regular file of sane size (a folder, a FIFO, a
device, a link to one) is never read. A cache folder that cannot be used (not writable, a file, a
lock that cannot be taken) costs the cache only: kernels are built without it, and the problem is
reported once and in the status report (see ``faults``).

Location: ``$PYTHON_NATIVE_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/python-native`` (or
``~/.cache/python-native``), in a ``kernels`` subfolder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_native.foundations import env, faults

try:
    import fcntl
except ImportError:  # pragma: no cover  (non-POSIX: no cross-process lock, writes stay atomic)
    fcntl = None  # type: ignore[assignment]

CACHE_DIR_ENV = env.CACHE_DIR[0]
MAGIC = b"PYTHON-NATIVE-KERNEL 1\n"
_MAX_HEADER = 1 << 16
MAX_ENTRY_BYTES = 1 << 30  # no compiled kernel comes near; anything bigger is not an entry


def default_root() -> Path:
    """Where entries live: the env override, else the user cache dir."""
    override = env.cache_dir()
    if override:
        return Path(override).expanduser()
    base = env.user_cache_base() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "python-native" / "kernels"


def source_fingerprint(*paths: str | os.PathLike[str]) -> str:
    """SHA-256 over the given source files, so an edited kernel never reuses an old binary."""
    digest = hashlib.sha256()
    for path in sorted(str(p) for p in paths):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("python-native")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class EntryKey:
    """Everything a compiled binary depends on; ``fields`` must be JSON-serializable."""

    fields: Mapping[str, Any]

    def canonical(self) -> str:
        return json.dumps(self.fields, sort_keys=True, separators=(",", ":"), default=str)

    def file_name(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest() + ".bin"


class KernelCache:
    """A folder of checked entries; see the module docstring for the format and guarantees."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root) if root is not None else default_root()

    def path(self, key: EntryKey) -> Path:
        return self.root / key.file_name()

    def load(self, key: EntryKey) -> bytes | None:
        """The payload stored for ``key``, or None when absent or not a valid entry for it."""
        path = self.path(key)
        data = _read_regular(path)
        if data is _ABSENT:
            return None
        payload = None if data is None else _decode(data, key)
        if payload is None:
            with contextlib.suppress(OSError):
                path.unlink()  # a link goes, never what it points to; a folder stays (and is never read)
        return payload

    def store(self, key: EntryKey, payload: bytes) -> Path:
        """Write ``payload`` for ``key`` atomically; returns the entry's path."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_encode(key, payload))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    def get_or_build(self, key: EntryKey, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """``(payload, cached)``: the stored payload, or ``build()``'s, stored once across processes.

        A cache folder that cannot be used never costs the kernel: it is built without the cache.
        """
        payload = self.load(key)
        if payload is not None:
            return payload, True
        lock = self._lock(key)
        if lock is None:
            return build(), False
        with lock:
            payload = self.load(key)  # another process may have built it while we waited
            if payload is not None:
                return payload, True
            payload = build()
            try:
                self.store(key, payload)
            except (OSError, ValueError) as e:
                self._unusable(e, f"the entry {self.path(key)} cannot be written")
            else:
                faults.resolve(_FAULT_SOURCE)
            return payload, False

    def _lock(self, key: EntryKey) -> contextlib.AbstractContextManager | None:
        """The cross-process lock of ``key``'s entry, taken; None when the folder cannot hold one."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if fcntl is None:
                return contextlib.nullcontext()
            lock = open(self.root / (key.file_name() + ".lock"), "a+b")  # closed by _held
        except (OSError, ValueError) as e:
            self._unusable(e)
            return None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        except OSError as e:
            lock.close()
            self._unusable(e)
            return None
        return _held(lock)

    def _unusable(self, error: Exception, what: str = "") -> None:
        why = str(error)
        if isinstance(error, OSError) and error.strerror:
            why = error.strerror + (f": {error.filename}" if error.filename else "")
        faults.report(
            _FAULT_SOURCE, f"{what or f'the folder {str(self.root)!r} cannot be used'} ({why})",
            f"point {CACHE_DIR_ENV} at a writable folder; kernels are compiled without caching meanwhile",
            stacklevel=3,
        )


_FAULT_SOURCE = "kernel cache"
_ABSENT: Any = object()  # nothing at the entry's path


@contextlib.contextmanager
def _held(lock: Any) -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        lock.close()


def _read_regular(path: Path) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of at most ``MAX_ENTRY_BYTES``; ``_ABSENT``
    when nothing is there; None for anything else (never blocking on a FIFO, never reading a device)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return _ABSENT
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ENTRY_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_ENTRY_BYTES + 1)
        return data if len(data) <= MAX_ENTRY_BYTES else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _encode(key: EntryKey, payload: bytes) -> bytes:
    header = {"key": json.loads(key.canonical()), "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def _decode(data: bytes, key: EntryKey) -> bytes | None:
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC) : end])
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if not isinstance(header, dict) or header.get("key") != json.loads(key.canonical()):
        return None  # a foreign entry (hash collision or a file copied in by hand)
    payload = data[end + 1 :]
    if header.get("size") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None  # truncated or altered
    return payload
