"""Triton backend: availability checks and the registration of its op library.

Nothing here imports triton. Availability comes from package metadata; the op families live in
``python_native_dsls.triton.ops``, their plans in ``plans``, the kernels in ``kernels`` (imported by
each impl on its first call), where they run in ``target``, and the launcher's stand-ins (stubbed
launches, a simulated device) for tests, benchmarks and the kernel report in ``testing``.

With ``PYTHON_NATIVE_TRITON_INTERPRET=1`` (or Triton's own ``TRITON_INTERPRET=1``) the backend is
available without a GPU: overrides sit at the CPU dispatch key and Triton's interpreter runs the
very same kernels on CPU tensors.
"""

from __future__ import annotations

import functools
import os

from packaging.version import Version

from .. import announce as _announce

# The target facts live below everything else in the backend; callers outside it ask the package.
from .target import DSL_NAME, device_type, dispatch_key, interpret_mode  # noqa: F401

NAME = DSL_NAME
MINIMUM_VERSION = Version("3.6")

_installed_at: str | None = None  # the dispatch key ``register_overrides`` installed the library at


def runtime_version() -> Version | None:
    from python_native.panel import dsl_support

    return dsl_support.installed_version("triton")


@functools.cache
def _install_problem() -> str | None:
    from python_native.panel import dsl_support

    return dsl_support.install_problem("triton", "triton", MINIMUM_VERSION)


def unavailable_reason() -> str | None:
    """Why the backend cannot run kernels here, or None when it can."""
    problem = _install_problem()
    if problem is not None:
        return problem
    if interpret_mode():
        return None
    import torch

    if not torch.backends.cuda.is_built():
        return "no CUDA device (torch is a CPU build)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def runtime_available() -> bool:
    return unavailable_reason() is None


def can_register() -> bool:
    """Whether overrides can be installed: cheaper than availability, no CUDA probe at import."""
    if _install_problem() is not None:
        return False
    if interpret_mode():
        return True
    import torch

    return torch.backends.cuda.is_built()


def register_overrides() -> list:
    """Install every op of the library at this backend's key; returns the handles."""
    global _installed_at
    if interpret_mode():
        # Triton reads this when it is first imported, which happens at the first kernel call.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from python_native.panel import dsl_support

    from .ops import SKIPPED, all_overrides

    key = dispatch_key()
    _installed_at = key
    return dsl_support.register_specs(NAME, key, all_overrides(), SKIPPED)


def settings_changed() -> str | None:
    """Why the installed overrides no longer match the interpreter switch (set or unset since they
    were installed), with what to do; None when they match."""
    if _installed_at is None or _installed_at == dispatch_key():
        return None
    from python_native.foundations import env

    variable = env.TRITON_INTERPRET[0]
    return (
        f"{variable} was {'set' if interpret_mode() else 'unset'} after the Triton overrides were installed at "
        f"{_installed_at} (when torch imported python_native); they stay at {_installed_at}. Set {variable} "
        f"before `import torch`: in the shell, or in os.environ before the first `import torch`"
    )


def skipped_overrides() -> dict[str, str]:
    """Op families (and single ops) not installed here, each with why (for the status report)."""
    from .ops import SKIPPED

    return dict(SKIPPED)


# Last: the module is complete, so the control plane may register it now.
_announce(NAME, __name__)
