"""The user's own calibration tables: written once by ``bench --calibrate``, in force after.

Many processes may start at once (eight ranks of a job) while a calibration run writes: a table
is written to a fresh temporary file in the same folder, flushed, and renamed over its final name
(``foundations.trust``: no link is followed), so a reader sees the old file or the new one, never
half of one; writers (and deleters) also hold a lock on the folder's ``.lock`` file so two runs do
not interleave their renames. The user's folder is created writable by nobody else, as the
readers require (``sources``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from python_native.features.calibration import sources, tables
from python_native.foundations import safe_write, trust


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with trust.locked(folder / ".lock"):
        yield


def _make_folder(folder: Path, user: bool) -> None:
    if user:
        trust.make_folder(folder, sources.user_root())
    else:  # a folder the user named: made and checked by the write rules (``safe_write``)
        safe_write.real_folder(folder)


def write_atomically(path: Path, text: str, lock: bool = True) -> None:
    """Write ``text`` to ``path`` through a fresh temporary file in its folder and a rename (under
    the folder's lock where ``lock``: the user's folder, where other processes read and write)."""
    path = Path(path)
    _make_folder(path.parent, lock)
    with _locked(path.parent) if lock else contextlib.nullcontext():
        trust.write_atomic(path, text.encode())


def unwritable(folder: Path) -> str | None:
    """Why a table cannot be written into ``folder`` (checked before a long calibration run), or None."""
    folder = Path(folder)
    try:
        _make_folder(folder, folder == sources.user_dir())
    except trust.Untrusted as e:
        return f"{e.path} {e.why} ({e.remedy})"
    except OSError as e:
        return f"{folder}: {e.strerror or e}"
    return None if os.access(folder, os.W_OK) else f"{folder}: not writable"


def save(table: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Validate ``table`` and write it: to ``path``, else into the user's folder, named by its
    device and the versions it was measured with. Returns where it went."""
    tables.validate(table, "the table to write")
    user = path is None
    if user:
        path = sources.user_dir() / sources.user_table_filename(table["device"], sources.table_versions(table))
    path = Path(path).expanduser()
    write_atomically(path, json.dumps(table, indent=1) + "\n", lock=user)
    return path


def user_tables(device_key: str | None = None) -> list[Path]:
    """The table files in the user's folder (for ``device_key`` only, when given)."""
    folder = sources.user_dir()
    try:
        found = sorted(p for p in folder.glob("*.json") if p.is_file())
    except OSError:
        return []
    if device_key is None:
        return found
    slug = tables.device_slug(device_key)
    return [p for p in found if p.name == f"{slug}.json" or p.name.startswith(f"{slug}-")]


def delete_user_tables(device_key: str | None = None) -> list[Path]:
    """Remove the user's tables (for ``device_key`` only, when given); returns those removed."""
    folder = sources.user_dir()
    if not folder.is_dir():
        return []
    trust.check_folder(folder, sources.user_root())  # never write into a folder someone else controls
    removed = []
    with _locked(folder):
        for path in user_tables(device_key):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def update_user_table(filename: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]) -> dict[str, Any] | None:
    """Read the user's table ``filename`` (None where there is none), let ``change`` return the table
    to write (None: write nothing), and write it, all under the folder's lock: processes adding rows
    at once (the ranks of a job, each on first use) never lose each other's. A file that is not a
    valid table raises ``ValueError`` and is left as it is. Returns the table as it stands after."""
    folder = sources.user_dir()
    path = folder / filename
    _make_folder(folder, True)  # ours, writable by nobody else (or refused), as the readers require
    with _locked(folder):
        current = tables.load(path) if path.is_file() else None
        fresh = change(current)
        if fresh is None:
            return current
        tables.validate(fresh, "the table to write")
        write_atomically(path, json.dumps(fresh, indent=1) + "\n", lock=False)
        return fresh
