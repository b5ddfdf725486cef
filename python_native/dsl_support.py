"""Helpers DSL backends share: availability without importing their runtime, installing their op
library, and taking a DSL out of routing when its runtime fails on first use."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

from python_native import calibration, codegen, dsl_registry, env, faults
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


def register_specs(dsl: str, dispatch_key: str, specs: Iterable[Any]) -> list:
    """Install a backend's op library (``OverrideSpec``s: ``op``, ``cond``, ``impl``, ``options``).

    Ops slower than aten on this machine's calibrated device are left out (a calibration table
    gates the conds of the rest where it could apply: see ``calibration.gate_override``). One op
    that cannot be installed here never costs the others.
    """
    log = logging.getLogger("python_native")
    calibrated = calibration.gates_needed(dispatch_key)
    handles = []
    for spec in specs:
        if calibrated and calibration.never_wins(spec.op, dsl):
            log.info("python_native: %s %s left out: slower than aten on every calibrated device", dsl, spec.op)
            continue
        try:
            handles.append(REGISTRY.register(dsl, "aten", spec.op, dispatch_key, spec.cond, spec.impl, **spec.options))
        except Exception:
            log.exception("python_native: %s override of %s not installed", dsl, spec.op)
    return handles


def runtime_failed(dsl: str, error: BaseException) -> codegen.OverrideUnavailable:
    """``dsl``'s runtime raised when first imported (at its first kernel call, since runtimes load
    lazily): make the DSL unavailable, route its slots around it (aten, or the next override,
    serves its calls from now on) and record why for the status report.

    Returns the exception the failing impl raises (``raise runtime_failed(...) from error``), so
    that the router hands the very call that found the failure on too.
    """
    reason = f"its runtime failed to import: {type(error).__name__}: {error}"
    if dsl_registry.record_runtime_failure(dsl, reason):
        with REGISTRY.lock:
            REGISTRY.unroutable_dsls.add(dsl)
            REGISTRY.refresh_all()
        faults.report(
            dsl, reason, "reinstall or repair it; aten serves the calls of its overrides meanwhile", stacklevel=3
        )
    return codegen.OverrideUnavailable(f"{dsl}: {dsl_registry.runtime_failure(dsl)}")
