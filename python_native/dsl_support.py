"""Helpers DSL backends share: availability without importing their runtime, and installing their op library."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

from python_native import calibration, env, nvml
from python_native.core.registry import REGISTRY


def installed_version(distribution: str) -> Version | None:
    """Version of an installed distribution from its metadata, or None if it is absent."""
    try:
        return Version(importlib.metadata.version(distribution))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


def module_importable(module: str) -> bool:
    """Whether ``module`` could be imported, found without executing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def version_problem(name: str, version: Version, minimum: Version) -> str | None:
    """Why ``version`` fails the gate (``>= minimum``), or None when it passes or gates are skipped."""
    if version >= minimum or env.skip_version_check():
        return None
    return (
        f"{name} {version} is outside the supported range (>= {minimum}); "
        f"set {env.SKIP_VERSION_CHECK[0]}=1 to skip this check"
    )


def install_problem(distribution: str, module: str, minimum: Version) -> str | None:
    """Why ``distribution`` cannot be used (absent, or older than ``minimum``), or None."""
    version = installed_version(distribution)
    if version is None or not module_importable(module):
        return f"{distribution} not installed"
    return version_problem(distribution, version, minimum)


def register_specs(dsl: str, dispatch_key: str, specs: Iterable[Any], skipped: dict[str, str] | None = None) -> list:
    """Install a backend's op library (``OverrideSpec``s: ``op``, ``cond``, ``impl``, ``options``, ``measured``).

    Ops slower than aten on this machine's calibrated device are left out (a calibration table
    gates the conds of the rest where it could apply: see ``calibration.gate_override``). At the
    CUDA key, ops no GPU has measured yet (``measured=False``) are left out too where no table in
    force covers them: without evidence an override could be slower than aten. Each op left out
    for that is named in ``skipped`` with why, and ``install_unmeasured`` installs it (what a
    calibration run does, to measure it). One op that cannot be installed here never costs the others.
    """
    log = logging.getLogger("python_native")
    calibrated = calibration.gates_needed(dispatch_key)
    measured_here = functools.cache(_calibrated_ops)  # tables are read once per call, and only if needed
    handles = []
    for spec in specs:
        if calibrated and calibration.never_wins(spec.op, dsl):
            log.info("python_native: %s %s left out: slower than aten on every calibrated device", dsl, spec.op)
            continue
        if dispatch_key == "CUDA" and not getattr(spec, "measured", True) and (spec.op, dsl) not in measured_here():
            why = UNMEASURED_REASON
            log.info("python_native: %s %s left out: %s", dsl, spec.op, why)
            _held_back[(dsl, dispatch_key, spec.op)] = spec
            if skipped is not None:
                skipped[spec.op] = why
            continue
        try:
            handles.append(REGISTRY.register(dsl, "aten", spec.op, dispatch_key, spec.cond, spec.impl, **spec.options))
        except Exception:
            log.exception("python_native: %s override of %s not installed", dsl, spec.op)
    return handles


UNMEASURED_REASON = (
    "not measured on this GPU yet (no calibration table in force covers it): off at CUDA until "
    "`bench --calibrate` has timed it here"
)
# The unmeasured ops ``register_specs`` left out, by (dsl, dispatch key, op): the last spec of each.
_held_back: dict[tuple[str, str, str], Any] = {}


def _calibrated_ops() -> frozenset[tuple[str, str]]:
    """The ``(op, dsl)`` pairs the tables in force hold timings of for this machine's GPUs.

    Tables named by ``PYTHON_NATIVE_CALIBRATION`` count wherever they came from; of the packaged
    ones, an op counts when the table of every GPU model NVML names has rows for it. Where NVML
    cannot tell, or a table cannot be read, nothing counts as measured.
    """
    try:
        tables = [calibration.load(path) for path in calibration.table_paths()]
    except (OSError, ValueError):
        return frozenset()
    rows = {t["device"]: {(r["op"], r.get("dsl", calibration.DEFAULT_DSL)) for r in t["rows"]} for t in tables}
    if os.environ.get(calibration.ENV_VAR, "").strip():
        return frozenset().union(*rows.values())
    keys = nvml.device_keys()
    if not keys:
        return frozenset()
    return frozenset.intersection(*(frozenset(rows.get(key, ())) for key in keys))


def install_unmeasured() -> list:
    """Install the unmeasured ops ``register_specs`` left out (a calibration run measures them); returns the handles."""
    log = logging.getLogger("python_native")
    handles = []
    while _held_back:
        (dsl, key, _), spec = _held_back.popitem()
        try:
            handles.append(REGISTRY.register(dsl, "aten", spec.op, key, spec.cond, spec.impl, **spec.options))
        except Exception:
            log.exception("python_native: %s override of %s not installed", dsl, spec.op)
    return handles
