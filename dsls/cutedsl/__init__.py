"""CuTe DSL backend (``nvidia-cutlass-dsl``): availability and version, without importing cutlass.

The backend has no op library yet; it is listed so users see whether CuTe DSL could run here.
"""

from __future__ import annotations

import functools

from packaging.version import Version

NAME = "cutedsl"
DISTRIBUTION = "nvidia-cutlass-dsl"
MODULE = "cutlass"
MINIMUM_VERSION = Version("4.0")


def runtime_version() -> Version | None:
    from python_native import dsl_support

    return dsl_support.installed_version(DISTRIBUTION)


@functools.cache
def _install_problem() -> str | None:
    from python_native import dsl_support

    return dsl_support.install_problem(DISTRIBUTION, MODULE, MINIMUM_VERSION)


def unavailable_reason() -> str | None:
    """Why CuTe DSL kernels cannot run here, or None when they can."""
    problem = _install_problem()
    if problem is not None:
        return problem
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        return f"CUDA device of compute capability {major}.x; CuTe DSL kernels need 8.0 or newer"
    return None


def runtime_available() -> bool:
    return unavailable_reason() is None


def can_register() -> bool:
    return False  # no op library yet


def register_overrides() -> list:
    return []


# Last, and the only module-level import of python_native: the module is complete, so the control
# plane may register it now. When python_native is importing this module from another thread at
# this very moment, the import machinery reports a deadlock here; python_native registers it then.
try:
    from python_native import _bootstrap  # noqa: E402
except RuntimeError as e:
    if type(e).__name__ != "_DeadlockError":
        raise
else:
    _bootstrap.backend_loaded(NAME, __import__("sys").modules[__name__])
