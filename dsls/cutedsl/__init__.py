"""CuTe DSL backend (``nvidia-cutlass-dsl``): availability, version and the registration of its op library.

Nothing here imports cutlass: availability comes from package metadata and the CUDA device, the
kernels live in ``dsls.cutedsl.kernels`` and are compiled (or read from the on-disk kernel cache)
by each impl on its first call. Overrides sit at the CUDA key, and only where a CUDA device of
compute capability 8.0 or newer is present.
"""

from __future__ import annotations

import functools
import logging

from packaging.version import Version

from python_native import dsl_support

NAME = "cutedsl"
DISTRIBUTION = "nvidia-cutlass-dsl"
MODULE = "cutlass"
MINIMUM_VERSION = Version("4.0")
# The launch path: compiled programs are TVM-FFI functions called with torch tensors.
FFI_DISTRIBUTION = "apache-tvm-ffi"
FFI_MODULE = "tvm_ffi"
FFI_MINIMUM_VERSION = Version("0.1")
MINIMUM_CAPABILITY = (8, 0)


def runtime_version() -> Version | None:
    return dsl_support.installed_version(DISTRIBUTION)


@functools.cache
def _install_problem() -> str | None:
    return dsl_support.install_problem(DISTRIBUTION, MODULE, MINIMUM_VERSION) or dsl_support.install_problem(
        FFI_DISTRIBUTION, FFI_MODULE, FFI_MINIMUM_VERSION
    )


def unavailable_reason() -> str | None:
    """Why CuTe DSL kernels cannot run here, or None when they can."""
    problem = _install_problem()
    if problem is not None:
        return problem
    import torch

    if not torch.backends.cuda.is_built():
        return "no CUDA device (torch is a CPU build)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < MINIMUM_CAPABILITY:
        return f"CUDA device of compute capability {major}.{minor}; CuTe DSL kernels need 8.0 or newer"
    return None


def runtime_available() -> bool:
    return unavailable_reason() is None


def can_register() -> bool:
    """Overrides are installed only where they can run: cutlass-dsl, TVM-FFI and an sm_80+ device."""
    return unavailable_reason() is None


def register_overrides() -> list:
    """Install every op of the library at the CUDA key; returns the handles."""
    from python_native import register_op_override

    from .ops import all_overrides

    handles = []
    for spec in all_overrides():
        try:
            handles.append(register_op_override(NAME, "aten", spec.op, "CUDA", spec.cond, spec.impl, **spec.options))
        except Exception:  # one op that cannot be installed here must not cost the others
            logging.getLogger("python_native").exception("python_native: cutedsl override of %s not installed", spec.op)
    return handles


# Last: the module is complete, so the control plane may register it now.
from python_native import _bootstrap  # noqa: E402

_bootstrap.backend_loaded(NAME, __import__("sys").modules[__name__])
