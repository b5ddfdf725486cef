"""On-disk cache of compiled kernels, shared by processes and DSLs.

A compiled kernel costs seconds to build and milliseconds to load, so each build is stored once
under a key that names everything the binary depends on: the kernel and its specialization, the
target architecture, the versions of the DSL compiler, torch and python-native, and a hash of the
kernel's source. Any change to one of them gives another file name, so stale binaries are never
looked up.

Each entry is one file: a magic line, a JSON header (the full key, the payload length and its
SHA-256) and the payload, with a manifest beside it recording the entry's size and SHA-256 when we
wrote it. An entry is loaded only under the rules of ``foundations.trust``: the cache folder and
every folder above it, the entry and its manifest are ours (or root's) and writable by nobody
else, and the entry matches its manifest; a header checks the entry only against itself, so an
entry someone else wrote or copied in is never taken for ours. An entry that fails a check is
removed and rebuilt, never loaded (and named in the status report when it was not simply
missing). Writers take a lock per entry (so concurrent processes build a kernel once), write to a
fresh temporary file and rename it, so readers see a whole entry or none.

Anything found at an entry's path that is not a regular file of sane size (a folder, a FIFO, a
device, a link) is never read. A cache folder that cannot be used (not writable, a file, a lock that
cannot be taken) or that fails the trust checks costs the cache only: kernels are built without it,
and the problem is reported once and in the status report (see ``faults``). While
``PYTHON_NATIVE_DISABLE`` is set, nothing is read from the cache.

Location: ``$PYTHON_NATIVE_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/python-native`` (or
``~/.cache/python-native``), in a ``kernels`` subfolder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_native.foundations import env, faults, trust

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

    def trusted_root(self) -> Path:
        """The cache folder, checked against the trust rules (``trust.Untrusted`` when it fails)."""
        return trust.check_folder(self.root, self.root)

    def load(self, key: EntryKey, *, locked: bool = False) -> bytes | None:
        """The payload stored for ``key``, or None when absent or not a valid entry of ours for it.

        An entry that fails a check is looked at again under its lock (``locked``: the caller holds
        it), so a write in progress is waited for, not taken for damage; still failing, it is
        removed and named in the status report."""
        if env.overrides_disabled():
            return None
        try:
            path = self.trusted_root() / key.file_name()
        except trust.Untrusted as e:
            self._untrusted(e)
            return None
        try:
            data, _ = trust.read_verified(path, self.root, MAX_ENTRY_BYTES)
        except FileNotFoundError:
            return None
        except trust.Untrusted as e:
            if not locked:
                lock = self._lock(key)
                if lock is None:
                    return None
                with lock:
                    return self.load(key, locked=True)
            self._rejected(e)
            trust.forget(path)
            return None
        payload = _decode(data, key)
        if payload is None:  # one of ours, for another key (moved by hand): never taken for this one
            trust.forget(path)
        return payload

    def store(self, key: EntryKey, payload: bytes) -> Path:
        """Write ``payload`` for ``key`` atomically, with its manifest; returns the entry's path."""
        folder = trust.make_folder(self.root, self.root)
        path = folder / key.file_name()
        trust.write_artefact(path, _encode(key, payload))
        return self.path(key)

    def get_or_build(self, key: EntryKey, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """``(payload, cached)``: the stored payload, or ``build()``'s, stored once across processes.

        A cache folder that cannot be used never costs the kernel: it is built without the cache.
        """
        payload = self.load(key)
        if payload is not None:
            return payload, True
        if env.overrides_disabled():
            return build(), False
        lock = self._lock(key)
        if lock is None:
            return build(), False
        with lock:
            payload = self.load(key, locked=True)  # another process may have built it while we waited
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
            folder = trust.make_folder(self.root, self.root)
            fd = trust.open_lock(folder / (key.file_name() + ".lock"))
        except trust.Untrusted as e:
            self._untrusted(e)
            return None
        except (OSError, ValueError) as e:
            self._unusable(e)
            return None
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            os.close(fd)
            self._unusable(e)
            return None
        return _held(fd)

    def _untrusted(self, e: trust.Untrusted) -> None:
        faults.report(
            _FAULT_SOURCE, f"the folder {str(self.root)!r} cannot be used: {e.path} {e.why}",
            f"{e.remedy}, or point {CACHE_DIR_ENV} at a private folder; kernels are compiled without caching meanwhile",
            stacklevel=4,
        )

    def _rejected(self, e: trust.Untrusted) -> None:
        faults.report(
            _ENTRY_SOURCE, f"an entry was not loaded: {e.path} {e.why}",
            f"nothing to do (it was removed and is rebuilt); if this recurs, check who writes to {self.root}",
            stacklevel=4,
        )

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
_ENTRY_SOURCE = "kernel cache entry"


@contextlib.contextmanager
def _held(fd: int) -> Iterator[None]:
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


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
