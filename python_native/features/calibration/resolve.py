"""What gates each device: its tables in precedence order, then the portable policy for a GPU.

Per (DSL, op, dtype) the first source with verdicts decides: a table lacking an op or a dtype
leaves it to the next table for the device, then (on a GPU) to the portable policy, then to the
cond alone. State is rebuilt by ``reset()``; every lookup is cached per device key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from python_native.features.calibration import first_use, portable, sources, tables, versions
from python_native.features.calibration.sources import OFF, Catalog, Table
from python_native.foundations import env, nvml

UNKNOWN_GPU = "a GPU NVML cannot name/sm0"  # stands for any GPU where the machine's models are unknown

_lock = threading.RLock()
_catalog: Catalog | None = None
_resolutions: dict[str, Resolution] = {}
_evidence: tuple[list[portable.Evidence], list[str]] | None = None
_device_keys: dict[Any, str] = {}  # torch.device -> device key
_device_key_fn: Callable[[Any], str] | None = None


class Resolution:
    """The sources that gate one device, strongest first, and what this process learned on it."""

    def __init__(self, device: str, found: list[Table], policy: portable.Policy | None, catalog_mode: str = "tables"):
        self.device, self.tables, self.policy = device, found, policy
        self.catalog_mode = catalog_mode
        self._overlaid: dict[tuple[str, str, str, bool], tuple[tuple[int, int], tables.Verdicts | None]] = {}

    def measuring(self, op: str | None = None) -> bool:
        """Whether cells no table measured (of ``op``, where given) are measured on first use here
        (``pn.benchmark``, or ``pn.patch``'s request for ``op``)."""
        return first_use.active_for(self.device, self.catalog_mode, op)

    def verdicts(self, dsl: str, op: str, dtype: str, measuring: bool = True) -> tables.Verdicts | None:
        """Per cell: first-use verdicts (this process's, then the tables'), ``first_use.MEASURE`` where
        ``pn.benchmark`` measures (unless ``measuring`` is False: the verdict that stands), then the
        tables' and the policy's. None where nothing speaks and nothing is measured."""
        key, stamp = (dsl, op, dtype, measuring), (first_use.generation, versions.generation)
        hit = self._overlaid.get(key)
        if hit is None or hit[0] != stamp:
            hit = self._overlaid[key] = (stamp, self._overlay(dsl, op, dtype, measuring))
        return hit[1]

    def _overlay(self, dsl: str, op: str, dtype: str, measuring: bool) -> tables.Verdicts | None:
        base = self.source_and_verdicts(dsl, op, dtype)[1]
        known = self._first_uses(dsl, op, dtype)
        measure = measuring and self.measuring(op)
        if not known and not measure:
            return base
        covered: set[int] | range = set()
        if measure and (first_use.mode() is True or first_use.requested(op)):
            covered = set().union(*(t.usable.exact.get((dsl, op, dtype), ()) for t in self.tables))
        elif measure and any(t.verdicts(op, dtype, dsl) is not None for t in self.tables):
            covered = range(_SPAN)  # "unmeasured": a table speaks for the op and dtype
        out: list[Any] = []
        for cell in range(_SPAN):
            if cell in known:
                out.append(() if known[cell] else False)
            elif measure and cell not in covered:
                out.append(first_use.MEASURE)
            else:
                out.append(base[cell] if base is not None else False)  # measured elsewhere only: declined
        return tuple(out)

    def source_and_verdicts(self, dsl: str, op: str, dtype: str) -> tuple[Any, tables.Verdicts | None]:
        """The first source with verdicts for (dsl, op, dtype) (a table's calibration rows, then the
        policy), and those verdicts; first-use verdicts are laid over them by ``verdicts``."""
        for table in self.tables:
            found = table.verdicts(op, dtype, dsl)
            if found is not None:
                return table, found
        if self.policy is not None:
            found = self.policy.verdicts(dsl, op, dtype)
            if found is not None:
                return self.policy, found
        return None, None

    def ops(self) -> set[tuple[str, str]]:
        """Every (dsl, op) some source of this device speaks for."""
        found = {(dsl, op) for t in self.tables for (op, dtype) in t.groups for dsl in t.dsls(op, dtype)}
        found |= {(dsl, op) for t in self.tables for (dsl, op, _) in t.usable.first_use}
        found |= first_use.learned_ops(self.device)
        return found | (set(self.policy.cells) if self.policy is not None else set())

    def dtypes(self, dsl: str, op: str) -> set[str]:
        found = {dtype for t in self.tables for (o, dtype) in t.groups if o == op and dsl in t.dsls(o, dtype)}
        found |= {dtype for t in self.tables for (d, o, dtype) in t.usable.first_use if (d, o) == (dsl, op)}
        found |= first_use.learned_dtypes(self.device, dsl, op)
        if self.policy is not None:
            found |= set(self.policy.cells.get((dsl, op), {}))
        return found

    def speaks_for(self, dsl: str, op: str) -> bool:
        """Some source has verdicts for ``dsl``'s ``op`` here, or ``pn.benchmark`` will measure it."""
        return self.measuring(op) or bool(self.dtypes(dsl, op))

    def never_wins(self, dsl: str, op: str) -> bool:
        """Some source speaks for the op here, and for every dtype the source that decides it loses
        everywhere (never while ``pn.benchmark`` measures here: a first use may find a win)."""
        if self.measuring(op):
            return False
        dtypes = self.dtypes(dsl, op)
        return bool(dtypes) and all(self._loses(dsl, op, dtype) for dtype in dtypes)

    def _loses(self, dsl: str, op: str, dtype: str) -> bool:
        known = self._first_uses(dsl, op, dtype)
        if any(known.values()):
            return False
        for table in self.tables:
            if dsl in table.dsls(op, dtype):
                return table.loses_everywhere(op, dtype, dsl)
        found = self.policy.verdicts(dsl, op, dtype) if self.policy is not None else None
        return all(v is False for v in found) if found is not None else bool(known)

    def _first_uses(self, dsl: str, op: str, dtype: str) -> dict[int, bool]:
        """Cell -> won of the first-use verdicts for (dsl, op, dtype): this process's over the tables'."""
        known: dict[int, bool] = {}
        for table in reversed(self.tables):  # the strongest table last: its cells stay
            known.update(table.usable.first_use.get((dsl, op, dtype), {}))
        known.update(first_use.learned(self.device, dsl, op, dtype))
        return known


_SPAN = 2 * (tables.MAX_BUCKET + 1)


def catalog() -> Catalog:
    global _catalog
    found = _catalog
    if found is None:
        with _lock:
            if _catalog is None:
                _catalog = Catalog()
            found = _catalog
    return found


def stale() -> bool:
    """Whether ``PYTHON_NATIVE_CALIBRATION`` changed since the tables were listed (then ``reset()``)."""
    return _catalog is not None and _catalog.setting != (env.calibration_path() or "")


def evidence() -> tuple[list[portable.Evidence], list[str]]:
    """The portable policy's evidence (the shipped GPU tables) and why any was left out."""
    global _evidence
    if _evidence is None:
        with _lock:
            if _evidence is None:
                cat = catalog()
                parsed = [cat.parsed(origin, path) for origin, path in cat.shipped_files()]
                _evidence = portable.evidence([t for t in parsed if isinstance(t, Table)])
    return _evidence


def resolution(device_key: str, warn: bool = True) -> Resolution:
    """The sources gating ``device_key`` (cached); ``warn``: say once if a table in force is from other versions."""
    found = _resolutions.get(device_key)
    if found is None:
        with _lock:
            found = _resolutions.get(device_key)
            if found is None:
                found = _resolutions[device_key] = _build(device_key)
    if warn and found.tables and found.tables[0].drift:
        sources.warn_drift(found.tables[0])
    return found


def _build(device_key: str) -> Resolution:
    cat = catalog()
    if cat.mode == OFF:
        return Resolution(device_key, [], None, cat.mode)
    policy = None
    if sources.is_gpu_key(device_key):
        found, _ = evidence()
        if found:
            props = None if device_key == UNKNOWN_GPU else nvml.properties(device_key)
            policy = portable.Policy(found, device_key, props)
    return Resolution(device_key, cat.tables_for(device_key), policy, cat.mode)


def devices_at(dispatch_key: str) -> list[Resolution]:
    """What can gate the overrides installed at ``dispatch_key``: a resolution per device it serves.

    The CPU key serves this process's CPU device key; the CUDA key the GPU models NVML lists (no
    CUDA initialisation). Where the devices are unknown (no NVML, another key), every device a
    table is for, and any other GPU (the portable policy with assumed properties).
    """
    if catalog().mode == OFF:
        return []
    keys: frozenset[str] | None = None
    if dispatch_key == "CPU":
        keys = frozenset({device_key("cpu")})
    elif dispatch_key == "CUDA":
        keys = nvml.device_keys()
    if keys is not None:
        return [resolution(k) for k in sorted(keys)]
    return [resolution(k, warn=False) for k in sorted(catalog().table_devices())] + [resolution(UNKNOWN_GPU)]


def device_at(dispatch_key: str) -> str | None:
    """The device key of every call ``dispatch_key`` serves, where there is one: this process's CPU
    device at the CPU key, the one GPU model NVML lists at the CUDA key; None where it can differ."""
    if dispatch_key == "CPU":
        return device_key("cpu")
    if dispatch_key == "CUDA":
        keys = nvml.device_keys()
        return next(iter(keys)) if keys is not None and len(keys) == 1 else None
    return None


def device_key(device: Any) -> str:
    """``"<name>/sm<cc>"`` for a CUDA device, ``"cpu"`` otherwise; cached per device."""
    import torch

    device = torch.device(device)
    key = _device_keys.get(device)
    if key is None:
        if _device_key_fn is not None:
            key = _device_key_fn(device)
        elif device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            key = f"{torch.cuda.get_device_name(device)}/sm{major}{minor}"
        else:
            key = device.type
        _device_keys[device] = key
    return key


def running_device_key() -> str | None:
    """This process's device key where knowing it costs nothing (no CUDA initialisation)."""
    if env.triton_interpret():
        return device_key("cpu")
    import torch

    if torch.cuda.is_initialized():
        return device_key(torch.device("cuda", torch.cuda.current_device()))
    return None


def set_device_key_fn(fn: Callable[[Any], str] | None) -> None:
    global _device_key_fn
    _device_key_fn = fn


def forget() -> None:
    """Drop every table, resolution and device key read so far (the caller refreshes the routers)."""
    global _catalog, _evidence
    with _lock:
        _catalog = None
        _evidence = None
        _resolutions.clear()
        _device_keys.clear()
