"""What the CuTe DSL kernels target: the runtime they are compiled with and the GPUs they run on.

The lowest module of the backend (no cutlass import): the package, its ops and the compiler read
these facts from here.
"""

from __future__ import annotations

from packaging.version import Version

DSL_NAME = "cutedsl"  # the name the backend registers under (``pn.cutedsl``)
DISTRIBUTION = "nvidia-cutlass-dsl"
# Oldest compute capability the kernels run on.
MINIMUM_CAPABILITY = (8, 0)


def runtime_version() -> Version | None:
    """The installed CuTe DSL version (compiled binaries depend on it), or None when absent."""
    from python_native.panel import dsl_support

    return dsl_support.installed_version(DISTRIBUTION)


def dispatch_key() -> str:
    """The backend key this DSL's overrides are installed at."""
    return "CUDA"


def device_type() -> str:
    """The tensor device type this DSL's kernels accept (what every cond checks)."""
    return "cuda"
