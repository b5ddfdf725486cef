"""Where calibration tables come from, and which one is in force for a device.

Precedence, strongest first: the tables named by ``PYTHON_NATIVE_CALIBRATION`` (a file or a
folder; they replace the two sources below), the user's own tables (written by ``bench
--calibrate`` into the user cache dir), the tables shipped in ``python_native/features/calibration/shipped_tables``;
devices none of them covers fall to the portable policy (``portable``). Of two tables for one
device, one measured with the running torch and DSL versions (major.minor) wins over one that was
not; a table measured with other versions still gates, and says so (status, one warning per process).

Files are listed when first needed and parsed only when a device they are named for is asked
about (registration runs inside ``import torch``). A file that cannot be read, is not a table, or
is named for another device is skipped with its reason and the fix; it never fails the caller.
A table decides which kernel serves a call, so the user's tables and those named by the variable
are read only under the rules of ``foundations.trust`` (their folders and the file are the user's
or root's and writable by nobody else); one that fails them is skipped and named in the status
report's problems. The shipped tables are part of the installed package.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from python_native.features.calibration import tables, usable_rows, versions
from python_native.foundations import env, faults, trust

ENV_VAR = env.CALIBRATION[0]
OFF, PORTABLE = "off", "portable"  # the variable's two words: no gate at all; the portable policy alone
PACKAGED_DIR = Path(__file__).resolve().parent / "shipped_tables"
RECALIBRATE = "python -m python_native bench --calibrate"
ORIGINS = (ENV_VAR, "user", "shipped")  # strongest first

_GPU_KEY = re.compile(r"/sm\d+$")
_drift_warned = False


class CalibrationDriftWarning(UserWarning):
    """A calibration table in force was measured with other torch or DSL versions."""


def is_gpu_key(device_key: str) -> bool:
    """Whether a device key names a GPU model (``"<name>/sm<cc>"``), which the portable policy covers."""
    return bool(_GPU_KEY.search(device_key))


def user_dir() -> Path:
    """The user's calibration tables: ``<user cache dir>/python-native/calibration``
    (platformdirs' user cache dir; on Linux ``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    try:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("python-native", appauthor=False))
    except ImportError:
        xdg = env.user_cache_base()
        base = Path(xdg or os.path.join(os.path.expanduser("~"), ".cache")) / "python-native"
    return base / "calibration"


def user_root() -> Path:
    """The cache base the user's tables live under (``<base>/python-native/calibration``): the root
    of their folder chain's checks."""
    return user_dir().parent.parent


def major_minor(version: Any) -> str:
    """``"2.13.0+cu130"`` -> ``"2.13"``; anything unparsable as it is."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(str(version))
    except InvalidVersion:
        return str(version)
    return f"{v.major}.{v.minor}"


def table_versions(header: dict[str, Any]) -> dict[str, str]:
    """``{"torch": "2.11", "triton": "3.6", ...}``: what a table was measured with (major.minor)."""
    found = {"torch": header.get("torch")}
    found.update(header.get("dsls") or {"triton": header.get("triton")})
    return {name: major_minor(v) for name, v in found.items() if v}


def running_versions(names: list[str]) -> dict[str, str]:
    """The running torch and DSL versions (major.minor) among ``names``; a DSL not here is left out."""
    from python_native.foundations import dsl_registry

    out = {}
    for name in names:
        if name == "torch":
            import torch

            out[name] = major_minor(torch.__version__)
        elif dsl_registry.is_known(name):
            version = dsl_registry.version(name)
            if version is not None:
                out[name] = major_minor(version)
    return out


def user_table_filename(device_key: str, versions: dict[str, str]) -> str:
    """``nvidia_h100_80gb_hbm3_sm90-torch2.13-triton3.9.json``: named by device and versions."""
    tags = "".join(f"-{tables.device_slug(name)}{major_minor(v)}" for name, v in versions.items())
    return tables.device_slug(device_key) + tags + ".json"


@dataclass
class Table:
    """A validated table file and where it came from; its rows as they count now in ``usable``."""

    path: str
    origin: str  # one of ORIGINS
    device: str
    header: dict[str, Any]
    rows: list[dict[str, Any]]
    drift: tuple[str, ...] = ()  # e.g. "torch 2.11 (running 2.13)"
    _usable: usable_rows.UsableRows | None = field(default=None, repr=False)

    @property
    def usable(self) -> usable_rows.UsableRows:
        """Its rows with stale ops dropped and first-use verdicts apart (rebuilt when a version changes)."""
        found = self._usable
        if found is None or found.generation != versions.generation:
            found = self._usable = usable_rows.UsableRows(self.header, self.rows)
        return found

    @property
    def groups(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The calibration rows per (op, dtype) that count (stale ops dropped, first-use rows apart)."""
        return self.usable.groups

    def dsls(self, op: str, dtype: str) -> frozenset[str]:
        """The DSLs with calibration rows for (op, dtype)."""
        return self.usable.dsls.get((op, dtype), frozenset())

    def verdicts(self, op: str, dtype: str, dsl: str) -> tables.Verdicts | None:
        """``dsl``'s verdicts for (op, dtype), or None where the table has no rows for them that count."""
        return self.usable.verdicts(op, dtype, dsl)

    def loses_everywhere(self, op: str, dtype: str, dsl: str) -> bool:
        """Every (bucket, width class) ``dsl`` was measured at for (op, dtype) lost (no verdict is built)."""
        cells: dict[tuple[int, int], bool] = {}
        for row in self.groups.get((op, dtype), ()):
            if row.get("dsl", tables.DEFAULT_DSL) == dsl:
                for wide in tables.row_classes(row):
                    cells[(row["bucket"], wide)] = cells.get((row["bucket"], wide), True) and row["wins"] is True
        return bool(cells) and not any(cells.values())

    def info(self) -> dict[str, Any]:
        return {
            "device": self.device, "path": self.path, "origin": self.origin, "rows": len(self.rows),
            **{k: self.header.get(k) for k in ("torch", "triton", "dsls", "date")},
            "versions": table_versions(self.header), "drift": list(self.drift),
            "stale": [f"{dsl} {op}" for dsl, op in self.usable.stale],
        }


@dataclass(frozen=True)
class Skipped:
    """A table file (or source) that was not used, with why and what to do."""

    path: str
    origin: str
    reason: str
    fix: str

    def info(self) -> dict[str, str]:
        return {"path": self.path, "origin": self.origin, "reason": self.reason, "fix": self.fix}


def _fix_for(origin: str) -> str:
    if origin == ENV_VAR:
        return f"correct or remove the file, or point {ENV_VAR} elsewhere (or unset it)"
    if origin == "user":
        return f"delete it (python -m python_native calibration --delete-user-tables) and rerun {RECALIBRATE}"
    return "reinstall python-native (a shipped table is damaged)"


class Catalog:
    """Every table this process can see, listed and parsed on demand; one per ``reset()``."""

    def __init__(self) -> None:
        self.setting = env.calibration_path() or ""
        word = self.setting.lower()
        self.mode = OFF if word == OFF else PORTABLE if word == PORTABLE else "tables"
        self.user_dir = user_dir()
        self.problems: list[Skipped] = []  # sources that could not be listed
        self._files: list[tuple[str, Path]] | None = None
        self._shipped: list[tuple[str, Path]] | None = None
        self._parsed: dict[Path, Table | Skipped] = {}
        self._running: dict[str, str] | None = None

    @property
    def source(self) -> str:
        if self.setting:
            return f"{ENV_VAR}={self.setting}"
        return "user and shipped tables"

    # ----- listing and parsing -----

    def files(self) -> list[tuple[str, Path]]:
        """``(origin, path)`` of every table file in force by its source (not yet parsed)."""
        if self._files is None:
            found: list[tuple[str, Path]] = []
            if self.mode == "tables" and self.setting:
                found += self._listed(ENV_VAR, Path(self.setting).expanduser(), named=True)
            elif self.mode == "tables":
                found += self._listed("user", self.user_dir)
                found += self._listed("shipped", PACKAGED_DIR)
            self._files = found
        return self._files

    def shipped_files(self) -> list[tuple[str, Path]]:
        """The shipped tables whatever the mode: the portable policy's evidence."""
        if self._shipped is None:
            self._shipped = self._listed("shipped", PACKAGED_DIR, note=False)
        return self._shipped

    def _listed(self, origin: str, path: Path, named: bool = False, note: bool = True) -> list[tuple[str, Path]]:
        if origin != "shipped" and not self._trusted(origin, path):
            return []
        try:
            if path.is_dir():
                return [(origin, p) for p in sorted(path.glob("*.json")) if p.is_file()]
            if named and path.is_file():
                return [(origin, path)]
            if named and note:
                self.problems.append(Skipped(str(path), origin, "no such table file or folder",
                                             f"point {ENV_VAR} at a table file or a folder of them, or unset it"))
        except OSError as e:
            if note:
                self.problems.append(Skipped(str(path), origin, f"cannot be listed ({e})", _fix_for(origin)))
        return []

    def _root(self, origin: str, path: Path) -> Path:
        """Where the checks of ``path``'s folder chain start: the cache base for the user's tables,
        the named folder (or the named file's folder) for the variable's."""
        if origin == "user":
            return user_root()
        named = Path(self.setting).expanduser()
        return named if named.is_dir() else named.parent

    def _trusted(self, origin: str, path: Path) -> bool:
        """Whether the folder of ``origin``'s tables passes the trust checks (a failure is noted)."""
        folder = path if path.is_dir() or origin == "user" else path.parent
        try:
            trust.check_folder(folder, self._root(origin, path))
        except trust.Untrusted as e:
            self.problems.append(_untrusted(str(folder), origin, e))
            return False
        return True

    def parsed(self, origin: str, path: Path) -> Table | Skipped:
        hit = self._parsed.get(path)
        if hit is None:
            hit = self._parsed[path] = self._parse(origin, path)
        return hit

    def _parse(self, origin: str, path: Path) -> Table | Skipped:
        try:
            if origin != "shipped":
                path = trust.check_file(path, self._root(origin, path))
            raw = tables.load(path)
        except trust.Untrusted as e:
            return _untrusted(str(path), origin, e)
        except (OSError, ValueError) as e:
            reason = str(e).removeprefix(f"{path}: ") if isinstance(e, ValueError) else f"cannot be read ({e})"
            return Skipped(str(path), origin, reason, _fix_for(origin))
        device = raw["device"]
        if origin != ENV_VAR and not _named_for(path.name, device):
            return Skipped(str(path), origin, f"its device is {device!r} but its name is not {tables.device_slug(device)}*.json",
                           "rename it after its device, or delete it")
        header = {k: v for k, v in raw.items() if k != "rows"}
        return Table(str(path), origin, device, header, raw["rows"], self._drift(header))

    def _drift(self, header: dict[str, Any]) -> tuple[str, ...]:
        measured = table_versions(header)
        if self._running is None:
            self._running = {}
        missing = [name for name in measured if name not in self._running]
        if missing:
            self._running.update(running_versions(missing))
            self._running.update({name: "" for name in missing if name not in self._running})
        return tuple(f"{name} {v} (running {self._running[name]})" for name, v in measured.items()
                     if self._running.get(name) and self._running[name] != v)

    # ----- what is in force -----

    def tables_for(self, device_key: str) -> list[Table]:
        """The tables for ``device_key`` in precedence order (the first is in force); skipped ones left out."""
        slug = tables.device_slug(device_key)
        found = []
        for origin, path in self.files():
            if origin != ENV_VAR and not _named_for(path.name, None, slug):
                continue
            table = self.parsed(origin, path)
            if isinstance(table, Table) and table.device == device_key:
                found.append(table)
        found.sort(key=lambda t: str(t.header.get("date") or ""), reverse=True)  # newest first, then:
        found.sort(key=lambda t: (bool(t.drift), ORIGINS.index(t.origin)))
        return found

    def everything(self) -> list[Table | Skipped]:
        """Every file of every source, parsed (for the status report and the calibration command)."""
        listed = dict.fromkeys(self.files() + self.shipped_files())
        return [self.parsed(origin, path) for origin, path in listed]

    def skipped(self) -> list[Skipped]:
        """Sources and files not used, with why (only those parsed so far, plus listing problems)."""
        return self.problems + [t for t in self._parsed.values() if isinstance(t, Skipped)]

    def table_devices(self) -> set[str]:
        """Every device some table in force is for (parses every table of the sources in force)."""
        return {t.device for t in (self.parsed(o, p) for o, p in self.files()) if isinstance(t, Table)}


def _untrusted(path: str, origin: str, e: trust.Untrusted) -> Skipped:
    """A table or folder that fails the trust checks: skipped, and named in the status report's problems."""
    fix = f"{e.remedy}; until then its tables are not read"
    faults.report(f"calibration tables ({path})", f"not read: {e.path} {e.why}", fix, stacklevel=5)
    return Skipped(path, origin, f"not read: {e.path} {e.why}", fix)


def _named_for(filename: str, device: str | None, slug: str | None = None) -> bool:
    """Whether ``filename`` is ``<slug>.json`` or ``<slug>-<versions>.json`` for the device."""
    slug = slug or tables.device_slug(device or "")
    return filename == f"{slug}.json" or (filename.startswith(f"{slug}-") and filename.endswith(".json"))


def warn_drift(table: Table) -> None:
    """Say once per process that a table in force was measured with other versions."""
    global _drift_warned
    if _drift_warned or not table.drift:
        return
    _drift_warned = True
    warnings.warn(
        f"python_native: the calibration table in force for {table.device} ({table.path}) was measured with "
        f"{', '.join(table.drift)}; it still gates the overrides. Recalibrate this GPU with: {RECALIBRATE}",
        CalibrationDriftWarning, stacklevel=2,
    )
