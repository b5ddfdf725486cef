"""CuTe DSL backend (``nvidia-cutlass-dsl``): availability, version and the registration of its op library.

Nothing here imports cutlass: availability comes from package metadata and the CUDA device, the
kernels live in ``python_native_dsls.cutedsl.kernels`` and are compiled (or read from the on-disk kernel cache)
by each impl on its first call. Overrides sit at the CUDA key, and only where a CUDA device of
compute capability 8.0 or newer is present.
"""

from __future__ import annotations

import functools

from packaging.version import Version

from .. import announce as _announce

# The target facts live below everything else in the backend; callers outside it ask the package.
from .target import DISTRIBUTION, DSL_NAME, MINIMUM_CAPABILITY, dispatch_key, runtime_version  # noqa: F401

NAME = DSL_NAME
MODULE = "cutlass"
MINIMUM_VERSION = Version("4.0")
# The launch path: compiled programs are TVM-FFI functions called with torch tensors.
FFI_DISTRIBUTION = "apache-tvm-ffi"
FFI_MODULE = "tvm_ffi"
FFI_MINIMUM_VERSION = Version("0.1")


@functools.cache
def _install_problem() -> str | None:
    from python_native.panel import dsl_support

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
    """Whether overrides can be installed: cutlass-dsl and TVM-FFI present and torch built with CUDA.

    Cheaper than availability: it never initialises CUDA (this runs during ``import torch``). The
    conds check each device's compute capability on first use instead (``ops.why.device``).
    """
    if _install_problem() is not None:
        return False
    import torch

    return torch.backends.cuda.is_built()


def opted_in() -> bool:
    """The CuTe DSL overrides route calls only when asked to, until they are validated on GPUs.

    They are installed either way (listed in the status report, ready for ``pn.cutedsl.enable()``);
    ``PYTHON_NATIVE_CUTEDSL=1`` enables them from the start.
    """
    from python_native.foundations import env

    return env.cutedsl_opted_in()


def register_overrides() -> list:
    """Install every op of the library at its key (CUDA); returns the handles."""
    from python_native.panel import dsl_support

    from .ops import SKIPPED, all_overrides

    handles = dsl_support.register_specs(NAME, dispatch_key(), all_overrides(), SKIPPED)
    if handles and not opted_in():
        from python_native.panel import controller

        controller.DSLController(NAME).disable()
    return handles


def skipped_overrides() -> dict[str, str]:
    """Op families (and single ops) not installed here, each with why (for the status report)."""
    from .ops import SKIPPED

    return dict(SKIPPED)


# Last: the module is complete, so the control plane may register it now.
_announce(NAME, __name__)
