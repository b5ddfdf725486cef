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


UNMEASURED = (
    "not yet timed against aten on a GPU, and no calibration table here covers it: off at CUDA until measured "
    f"(set {env.UNMEASURED[0]}=1 to install it for bench and --calibrate)"
)


def register_specs(dsl: str, dispatch_key: str, specs: Iterable[Any], skipped: dict[str, str] | None = None) -> list:
    """Install a backend's op library (``OverrideSpec``s: ``op``, ``cond``, ``impl``, ``options``,
    ``measured``).

    Ops slower than aten on this machine's calibrated device are left out (a calibration table
    gates the conds of the rest where it could apply: see ``calibration.gate_override``), and so
    are ops no GPU has timed yet (``measured=False``) at the CUDA key where no table covers them:
    never slower than aten without evidence (``PYTHON_NATIVE_UNMEASURED=1`` installs them, to
    measure them). Those are recorded in ``skipped`` (op -> why) for the status report. One op that cannot be installed here never costs the others.
    """
    log = logging.getLogger("python_native")
    calibrated = calibration.gates_needed(dispatch_key)
    handles = []
    for spec in specs:
        if calibrated and calibration.never_wins(spec.op, dsl):
            log.info("python_native: %s %s left out: slower than aten on every calibrated device", dsl, spec.op)
            continue
        if (dispatch_key == "CUDA" and not getattr(spec, "measured", True) and not env.install_unmeasured()
                and not calibration.covers(spec.op, dsl)):
            log.info("python_native: %s %s left out: %s", dsl, spec.op, UNMEASURED)
            if skipped is not None:
                skipped[spec.op] = UNMEASURED
            continue
        try:
            handles.append(REGISTRY.register(dsl, "aten", spec.op, dispatch_key, spec.cond, spec.impl, **spec.options))
        except Exception:
            log.exception("python_native: %s override of %s not installed", dsl, spec.op)
    return handles
