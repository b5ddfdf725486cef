"""Helpers DSL backends share: availability without importing their runtime, and installing their op library."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

from python_native import calibration, env
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

    Ops slower than aten at every size on every device this key serves are left out (a
    calibration table or the portable policy gates the conds of the rest where it can speak for
    them: see ``calibration.gate_override``); the status report names them. At the CUDA key, ops
    no GPU has measured yet (``measured=False``) are left out too where no source speaks for them:
    without evidence an override could be slower than aten. Each op left out for that is named in
    ``skipped`` with why, and ``install_unmeasured`` installs it (what a calibration run does, to
    measure it). One op that cannot be installed here never costs the others.
    """
    log = logging.getLogger("python_native")
    handles = []
    for spec in specs:
        why = calibration.leave_out(spec.op, dsl, dispatch_key)
        if why is not None:
            log.info("python_native: %s %s left out: %s", dsl, spec.op, why)
            continue
        if dispatch_key == "CUDA" and not getattr(spec, "measured", True):
            why = unmeasured_reason(spec.op, dsl, dispatch_key)
            if why is not None:
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


# The unmeasured ops ``register_specs`` left out, by (dsl, dispatch key, op): the last spec of each.
_held_back: dict[tuple[str, str, str], Any] = {}


def unmeasured_reason(op: str, dsl: str, dispatch_key: str) -> str | None:
    """Why an op no GPU has measured yet stays off at ``dispatch_key``: a device the key serves has
    no calibration source (a table with rows for it, or the portable policy with shipped evidence
    for it) that speaks for it. None where every device has one, or calibration is off."""
    try:
        if calibration.resolve.catalog().mode == calibration.OFF:
            return None
        devices = calibration.resolve.devices_at(dispatch_key)
        unmeasured = [r.device for r in devices if not r.speaks_for(dsl, op)]
    except Exception:  # unable to tell: no evidence
        logging.getLogger("python_native").exception("python_native: calibration could not judge %s %s", dsl, op)
        devices, unmeasured = [], []
    if devices and not unmeasured:
        return None
    return (f"not measured on this GPU yet ({', '.join(unmeasured) or 'no device known'}: no calibration table or "
            "shipped evidence covers it): off at CUDA until `bench --calibrate` has timed it here")


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
