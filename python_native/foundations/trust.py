"""Trust nothing on disk we did not write: the checks every loader runs and the writes every writer makes.

What python-native loads from its caches (the compiled front, compiled kernels, calibration tables)
runs in, or steers, the user's process, so a file is used only when nobody else could have put it
there or changed it:

- every folder from ``/`` down to the file, and the file itself, belongs to the current user or to
  root and is not writable by group or others (a sticky folder such as ``/tmp`` is fine: nobody
  can rename or replace what another user made in it);
- below the cache root nothing is a symbolic link (the root itself may be one: it is resolved);
- where an artefact has a manifest (a ``<name>.manifest.json`` beside it, written by us under
  the same rules), the file's size and SHA-256 match it, checked before anything reads or maps
  the file, so a truncated or altered library never reaches the loader.

Writes go through ``foundations.safe_write``, the one writer of every file the package writes:
atomic, through no link, never into another user's file, in a folder nobody else can redirect.
Folders we create drop group and others' write bits whatever the umask. A check that fails raises
``Untrusted`` (an ``OSError``, defined beside the writer) naming the path, why, and what the user
can do.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from python_native.foundations import safe_write
from python_native.foundations.safe_write import Untrusted
from python_native.foundations.safe_write import judge as _judge

try:
    import fcntl
except ImportError:  # pragma: no cover  (non-POSIX: no cross-process lock, writes stay atomic)
    fcntl = None  # type: ignore[assignment]

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = 1
_MAX_MANIFEST = 1 << 20
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def resolve_root(root: str | os.PathLike[str]) -> Path:
    """The cache root with its links resolved (a user may link their cache elsewhere); every
    folder above it must pass the checks too (``check_folder``)."""
    return Path(os.path.realpath(os.path.expanduser(os.fspath(root))))


def check_folder(folder: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """Check the chain ``/`` .. ``root`` .. ``folder`` as far as it exists; returns ``folder`` under
    the resolved root (what to open). Missing folders are fine: we would create them."""
    real_root = resolve_root(root)
    folder = Path(os.path.abspath(os.path.expanduser(os.fspath(folder))))
    below = _below(folder, Path(os.path.abspath(os.path.expanduser(os.fspath(root)))), real_root)
    for path in (*reversed(real_root.parents), real_root):
        _judge_existing(path, folder=True, link_ok=False)
    current = real_root
    for part in below.parts:
        current = current / part
        if not _judge_existing(current, folder=True):
            break
    return real_root / below


def _below(path: Path, root: Path, real_root: Path) -> Path:
    """``path`` relative to the cache root, named either as configured or resolved."""
    for base in (root, real_root):
        with contextlib.suppress(ValueError):
            return path.relative_to(base)
    raise Untrusted(path, f"is not inside the cache root {root}", f"use a folder under {root}")


def _judge_existing(path: Path, *, folder: bool, link_ok: bool = False) -> bool:
    """``_judge`` what is at ``path``; False when nothing is there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    _judge(path, info, folder=folder, link_ok=link_ok)
    return True


def make_folder(folder: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """``check_folder``, then create what is missing, none of it writable by group or others."""
    real = check_folder(folder, root)
    missing = []
    current = real
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        safe_write.make_private_folder(path)
        _judge(path, os.lstat(path), folder=True)
    return real


def check_file(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """Check ``path`` and its folder chain; returns the path to open. ``FileNotFoundError`` when absent."""
    path = Path(os.path.expanduser(os.fspath(path)))
    real = check_folder(path.parent, root) / path.name
    if not _judge_existing(real, folder=False):
        raise FileNotFoundError(2, "No such file", str(real))
    return real


# ----- reading -----


def _open_checked(path: Path, max_bytes: int) -> tuple[int, os.stat_result]:
    """Open ``path`` without following a link or blocking on a FIFO; judge what was opened."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        if os.path.islink(path):
            raise Untrusted(path, "is a symbolic link, where python-native writes only real files and folders",
                            f"remove the link {path}") from None
        raise Untrusted(path, f"cannot be opened ({e.strerror or e})", f"remove {path}") from None
    info = os.fstat(fd)
    try:
        _judge(path, info, folder=False)
        if not stat.S_ISREG(info.st_mode):
            raise Untrusted(path, "is not a regular file", f"remove {path}")
        if info.st_size > max_bytes:
            raise Untrusted(path, f"is larger ({info.st_size} bytes) than anything python-native writes there",
                            f"remove {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_file(path: str | os.PathLike[str], root: str | os.PathLike[str], max_bytes: int = _MAX_MANIFEST) -> bytes:
    """The bytes of a checked file (no manifest: for small files we wrote, such as state notes)."""
    fd, info = _open_checked(check_file(path, root), max_bytes)
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes + 1)[:max_bytes]


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """Where the manifest of the artefact at ``path`` lives: beside it."""
    path = Path(path)
    return path.with_name(path.name + MANIFEST_SUFFIX)


def read_manifest(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked manifest of the artefact at ``path``; ``Untrusted`` when missing or malformed."""
    where = manifest_path(path)
    try:
        raw = read_file(where, root)
    except FileNotFoundError:
        raise Untrusted(path, "has no manifest: python-native did not write it",
                        f"remove {path} (it is rebuilt where needed)") from None
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError):
        manifest = None
    if (not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT
            or manifest.get("file") != Path(path).name or not isinstance(manifest.get("size"), int)
            or not isinstance(manifest.get("sha256"), str)):
        raise Untrusted(where, "is not a manifest python-native wrote", f"remove {where} and {path}")
    return manifest


def read_verified(path: str | os.PathLike[str], root: str | os.PathLike[str], max_bytes: int) -> tuple[bytes, dict]:
    """``(bytes, manifest meta)`` of an artefact whose file, folders and manifest pass the checks and
    whose size and digest match its manifest. ``FileNotFoundError`` when there is no artefact."""
    real = check_file(path, root)
    manifest = read_manifest(real, root)
    fd, info = _open_checked(real, max_bytes)
    with os.fdopen(fd, "rb") as f:
        _same_size(real, info, manifest)
        data = f.read(manifest["size"] + 1)
    _same_digest(real, hashlib.sha256(data).hexdigest(), len(data), manifest)
    return data, manifest.get("meta") or {}


def verify_file(path: str | os.PathLike[str], root: str | os.PathLike[str], max_bytes: int) -> tuple[Path, dict]:
    """``(path to load, manifest meta)`` of a checked artefact, hashed without being kept in memory
    (for a library that is mapped next: its size and digest are checked before ``dlopen``)."""
    real = check_file(path, root)
    manifest = read_manifest(real, root)
    fd, info = _open_checked(real, max_bytes)
    digest, seen = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        _same_size(real, info, manifest)
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            seen += len(chunk)
    _same_digest(real, digest.hexdigest(), seen, manifest)
    return real, manifest.get("meta") or {}


def _same_size(path: Path, info: os.stat_result, manifest: dict) -> None:
    if info.st_size != manifest["size"]:
        raise Untrusted(path, f"is {info.st_size} bytes where its manifest says {manifest['size']} "
                        "(truncated or replaced)", f"remove {path} (it is rebuilt where needed)")


def _same_digest(path: Path, digest: str, size: int, manifest: dict) -> None:
    if size != manifest["size"] or digest != manifest["sha256"]:
        raise Untrusted(path, "does not match the SHA-256 in its manifest (damaged or replaced)",
                        f"remove {path} (it is rebuilt where needed)")


def forget(path: str | os.PathLike[str]) -> None:
    """Remove an artefact and its manifest (a link goes, never what it points to; a folder stays)."""
    for where in (Path(path), manifest_path(path)):
        with contextlib.suppress(OSError):
            os.unlink(where)


# ----- writing -----


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through ``safe_write``: a fresh temporary file in its folder and a
    rename, so a reader sees the old file or the new one, and nothing is written through a link."""
    safe_write.write(path, data, mode=mode)


def write_artefact(path: str | os.PathLike[str], data: bytes, meta: dict[str, Any] | None = None) -> None:
    """Write ``data`` to ``path`` atomically, with its manifest (``meta`` is kept in it)."""
    tmp = safe_write.temp_beside(path, 0o644, data)
    try:
        publish(tmp, path, meta)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def temp_path(path: str | os.PathLike[str], mode: int = 0o644) -> Path:
    """A fresh temporary file beside ``path`` for a tool to write into (a compiler's output); publish
    it with ``publish``, or remove it."""
    return safe_write.temp_beside(path, mode)


def publish(tmp: str | os.PathLike[str], path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
    """Record ``tmp``'s size and digest in ``path``'s manifest, then rename ``tmp`` to ``path``.

    The manifest goes first: a reader in between finds a manifest and no artefact (nothing built
    yet) or the artefact it describes, never an artefact without its manifest."""
    tmp, path = Path(tmp), Path(path)
    fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        os.fchmod(f.fileno(), stat.S_IMODE(os.fstat(f.fileno()).st_mode) & ~_WRITABLE_BY_OTHERS)
        while chunk := f.read(1 << 20):
            digest.update(chunk)
        size = f.tell()
    manifest = {"format": MANIFEST_FORMAT, "file": path.name, "size": size, "sha256": digest.hexdigest(),
                "meta": meta or {}}
    write_atomic(manifest_path(path), json.dumps(manifest, indent=1, sort_keys=True).encode())
    safe_write.put_in_place(tmp, path)


def open_lock(path: str | os.PathLike[str]) -> int:
    """A file descriptor on the lock file ``path`` (created if missing, never through a link, never
    another user's: nothing is written into it, but a lock someone else holds would stop us)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)
    info, owners = os.fstat(fd), safe_write.owners()
    if owners is not None and (info.st_uid not in owners or not stat.S_ISREG(info.st_mode)):
        os.close(fd)
        raise Untrusted(path, f"is not a lock file of ours (uid {info.st_uid})", f"remove {path}")
    return fd


def try_lock(path: str | os.PathLike[str]) -> int | None:
    """The lock on ``path`` taken without waiting (its descriptor), or None when another process holds it."""
    fd = open_lock(path)
    if fcntl is None:  # pragma: no cover
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the cross-process lock on ``path`` (waiting for it) inside the block."""
    fd = open_lock(path)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
