"""Where the Triton kernels run: on a GPU, or through Triton's CPU interpreter.

The lowest module of the backend (no triton import): the package, its ops, plans and kernels all
read these facts from here.
"""

from __future__ import annotations

DSL_NAME = "triton"  # the name the backend registers under (``pn.triton``)


def interpret_mode() -> bool:
    """Whether kernels run through Triton's CPU interpreter instead of on a GPU."""
    from python_native.foundations import env

    return env.triton_interpret()


def dispatch_key() -> str:
    """The backend key this DSL's overrides are installed at."""
    return "CPU" if interpret_mode() else "CUDA"


def device_type() -> str:
    """The tensor device type this DSL's kernels accept (what every cond checks)."""
    return "cpu" if interpret_mode() else "cuda"
