"""Helpers DSL backends share to report availability without importing their runtime."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.version import InvalidVersion, Version

from python_native import env


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
