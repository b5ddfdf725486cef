"""One writer for every file python-native writes: whatever it writes cannot be redirected by another user.

Every file the package writes (cache entries and their manifests, build notes and logs, router
dumps, calibration tables, benchmark results and plots, replay proofs, temporary files) goes through
here, under one set of rules:

- **The folder.** It is reached from ``/`` one name at a time. Every folder passed belongs to us or to
  root and is writable by nobody else, unless it is sticky (``/tmp``): there nobody can rename or
  remove what another made. Every link followed belongs to us or to root (a link another user made,
  say in ``/tmp``, is refused, not followed). Folders we create lose group and others' write bits.
  The folder is then opened and every later step is taken relative to it, so swapping a folder
  after the checks changes nothing.
- **The target.** What is already at the file's name must be a regular file of ours, or a link
  where the folder is private (only we, or root, can make names in it: the link was ours, and the
  rename replaces the link itself, never what it points to). In a folder others can write to (a
  sticky one) a link is refused, and anywhere a file of another user's is refused.
- **The write.** Into a fresh temporary file (``O_CREAT | O_EXCL | O_NOFOLLOW``) in that folder,
  not writable by group or others, flushed to disk, then renamed over the target: a reader sees
  the old file or the new one, and nothing is ever written through a link or into a file someone
  else made. A stream (a log a child process writes) gets a fresh file the same way, renamed into
  place before its first byte.

A refusal raises ``Untrusted`` (an ``OSError``) naming the path, why, and what the user can do.
The rules for what is read live in ``foundations.trust``, which shares the checks below.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_MAX_LINKS = 40  # as the kernel's own limit on links followed in one path


class Untrusted(OSError):
    """A file or folder python-native will not use: ``path``, ``why`` and ``remedy`` say which, why
    and how to make it usable."""

    def __init__(self, path: str | os.PathLike[str], why: str, remedy: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why, self.remedy = str(path), why, remedy

    def line(self) -> str:
        """The refusal in one line: the path, why, and the fix."""
        return f"{self.path} {self.why} ({self.remedy})"


def owners() -> tuple[int, ...] | None:
    """The owners whose files we trust (us and root); None where the platform has no owners."""
    return (os.geteuid(), 0) if hasattr(os, "geteuid") else None


def judge(path: Path, info: os.stat_result, *, folder: bool, link_ok: bool = False) -> None:
    """Raise ``Untrusted`` when ``info`` (an ``lstat`` of ``path``) shows that someone else could
    have written or replaced what is at ``path``."""
    trusted = owners()
    if trusted is None:  # pragma: no cover  (no ownership to check on this platform)
        return
    if stat.S_ISLNK(info.st_mode) and not link_ok:
        raise Untrusted(path, "is a symbolic link, where python-native writes only real files and folders",
                        f"remove the link {path}")
    if info.st_uid not in trusted:
        raise Untrusted(path, f"belongs to another user (uid {info.st_uid})",
                        f"remove {path}, or have it belong to you or root")
    if stat.S_ISDIR(info.st_mode) != folder and not stat.S_ISLNK(info.st_mode):
        raise Untrusted(path, "is not a regular file" if not folder else "is not a folder", f"remove {path}")
    sticky = folder and info.st_mode & stat.S_ISVTX
    if info.st_mode & _WRITABLE_BY_OTHERS and not sticky:
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if info.st_mode & bit)
        raise Untrusted(path, f"is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o}): anyone who can "
                        "write there could plant code", f"chmod go-w {path}")


# ----- the folder -----


def real_folder(folder: str | os.PathLike[str], *, create: bool = True) -> Path:
    """The folder at ``folder``, reached from ``/`` one name at a time: each folder passed is judged,
    each link followed must be ours or root's, missing folders are made (where ``create``; else
    ``FileNotFoundError``). Returns the real path, links resolved."""
    todo = _names(os.path.abspath(os.path.expanduser(os.fspath(folder))))
    if owners() is None:  # pragma: no cover  (no owners to check: make it and go on)
        os.makedirs(folder, exist_ok=True)
        return Path(folder)
    current, links = Path("/"), 0
    judge(current, os.lstat(current), folder=True)
    while todo:
        name = todo.pop()
        if name == "..":
            current = current.parent
            continue
        here = current / name
        info = _lstat(here, create)
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if info.st_uid not in owners() or links > _MAX_LINKS:
                raise Untrusted(here, f"is a symbolic link that belongs to another user (uid {info.st_uid})"
                                if links <= _MAX_LINKS else "has too many levels of symbolic links",
                                f"remove the link {here}, or write somewhere only you can write")
            target = os.readlink(here)
            todo.extend(_names(target))
            current = Path("/") if target.startswith("/") else current
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(here))
        judge(here, info, folder=True)
        current = here
    return current


def _names(path: str) -> list[str]:
    """The names along ``path``, the first last (a stack to pop), without empty names and dots."""
    return [name for name in reversed(path.split("/")) if name not in ("", ".")]


def _lstat(path: Path, create: bool) -> os.stat_result:
    """``lstat`` of ``path``; a missing folder is made first where ``create`` (not writable by others)."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise
    make_private_folder(path)
    return os.lstat(path)


def make_private_folder(path: str | os.PathLike[str]) -> None:
    """Make one folder, not writable by group or others whatever the umask; one made by another
    process at the same moment is left for the caller to judge."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return
    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~_WRITABLE_BY_OTHERS)


@contextlib.contextmanager
def _opened(path: str | os.PathLike[str], create: bool) -> Iterator[tuple[int, Path, str]]:
    """``(folder descriptor, real folder, name)`` for the file at ``path``: the folder checked and
    opened, what is at the name checked (``_check_target``)."""
    path = Path(os.path.expanduser(os.fspath(path)))
    if path.name in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, "a file name is needed, not a folder", str(path))
    folder = real_folder(path.parent, create=create)
    fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    try:
        info = os.fstat(fd)
        judge(folder, info, folder=True)  # the folder opened is the folder judged, whatever happens to its path
        _check_target(fd, folder, path.name, shared=bool(info.st_mode & _WRITABLE_BY_OTHERS))
        yield fd, folder, path.name
    finally:
        os.close(fd)


def _check_target(folder_fd: int, folder: Path, name: str, *, shared: bool) -> None:
    """Refuse what is at ``name`` unless it is absent, a regular file of ours, or a link in a private folder."""
    try:
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    target = folder / name
    if stat.S_ISLNK(info.st_mode):
        if shared or info.st_uid not in (owners() or (info.st_uid,)):
            raise Untrusted(target, "is a symbolic link in a folder other users can write to: python-native "
                            "writes through no link", f"remove the link {target}, or write somewhere only you can write")
        return  # a private folder: the rename replaces the link, never what it points to
    if not stat.S_ISREG(info.st_mode):
        raise Untrusted(target, "is not a regular file", f"remove {target}, or write to another name")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise Untrusted(target, f"belongs to another user (uid {info.st_uid})",
                        f"remove {target}, or write somewhere only you can write")


# ----- writing -----


def check(path: str | os.PathLike[str]) -> Path:
    """Whether ``path`` could be written (``Untrusted`` or another ``OSError`` when not), before a long
    run that ends by writing it; makes its folder. Returns the real path."""
    with _opened(path, True) as (_, folder, name):
        return folder / name


def write(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644, create: bool = True) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically under the rules above; returns the real path."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with _opened(path, create) as (folder_fd, folder, name):
        tmp, fd = _fresh(folder_fd, name, mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder_fd)
            raise
        return folder / name


def open_fresh(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A descriptor on a new, empty file of ours now at ``path`` (for a stream such as a log a child
    process writes): made as ``write`` makes a file, renamed into place before its first byte."""
    with _opened(path, True) as (folder_fd, _, name):
        tmp, fd = _fresh(folder_fd, name, mode)
        try:
            os.rename(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder_fd)
            raise
        return fd


def temp_beside(path: str | os.PathLike[str], mode: int = 0o644, data: bytes = b"") -> Path:
    """A fresh temporary file of ours beside ``path`` holding ``data`` (flushed), for a tool to fill
    (a compiler's output) or to publish: put it in place with ``put_in_place``, or remove it."""
    with _opened(path, True) as (folder_fd, folder, name):
        tmp, fd = _fresh(folder_fd, name, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return folder / tmp


def put_in_place(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Rename ``tmp`` (from ``temp_beside``, in the same folder) over ``path``, the target checked first."""
    tmp, path = Path(tmp), Path(path)
    with _opened(path, False) as (folder_fd, folder, name):
        if real_folder(tmp.parent, create=False) != folder:
            raise ValueError(f"{tmp} is not in the folder of {path}")
        os.rename(tmp.name, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)


def _fresh(folder_fd: int, name: str, mode: int) -> tuple[str, int]:
    """``(name, descriptor)`` of a new, empty file beside ``name`` (``O_EXCL``: never one someone else
    made), not writable by group or others whatever the umask."""
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=folder_fd)
    try:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~_WRITABLE_BY_OTHERS)
    except BaseException:
        os.close(fd)
        raise
    return tmp, fd


def new_temp_file(data: bytes | str, *, prefix: str = "python-native-", suffix: str = "") -> Path:
    """A new file holding ``data`` in the temporary folder (``tempfile.gettempdir()``) under a fresh
    random name, readable by us alone; written as ``write`` writes. The caller removes it."""
    import tempfile

    return write(Path(tempfile.gettempdir()) / f"{prefix}{os.urandom(8).hex()}{suffix}", data, mode=0o600,
                 create=False)
