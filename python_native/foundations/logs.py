"""The ``python_native`` logger, switched by torch's own ``TORCH_LOGS``.

``TORCH_LOGS=+python_native`` shows the package's registration diagnostics (DSLs missing or too
old, op families left out, calibration gates and switches in force, each override installed) and
kernel compile events; ``TORCH_LOGS=python_native`` the summary lines without the per-override
ones; ``TORCH_LOGS=python_native_compile`` the compile events alone (op, variant, dispatch key,
seconds). ``torch._logging.set_logs(modules={"python_native": logging.DEBUG,
"python_native_compile": True})`` does the same at run time. Unset, nothing new is printed: warnings and errors only, as before.

Registration (``register_with_torch``) runs when the package is imported, which ``import torch``
does while it autoloads its ``torch.backends`` entry points, before torch reads ``TORCH_LOGS``
(torch 2.13 on; an older torch reads it first, and then knows ``python_native`` only as a module name
and ``python_native_compile`` not at all until ``set_logs``).
Records emitted during that import would come before torch applies the setting, so the loggers
are configured from ``TORCH_LOGS`` here first, the way torch configures them (torch then does it
again, replacing the handler it tracks, so nothing prints twice).

Imported before torch (``import python_native`` or a backend first), the package itself imports
torch, whose import reads ``TORCH_LOGS`` before the names are registered: that import sees the
setting without our names (``_import_torch_logging``), which are applied here once registered.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from python_native.foundations import env

LOG = "python_native"
COMPILE_ARTIFACT = "python_native_compile"
QUALIFIED_NAMES = ("python_native", "python_native_dsls")

log = logging.getLogger(LOG)
# The compile events' logger: torch's artifact logger once registered (a child of ``python_native``).
_compile_log = logging.getLogger(f"{LOG}.compile")
_registered = False


def register_with_torch() -> bool:
    """Make ``python_native`` and ``python_native_compile`` names ``TORCH_LOGS`` accepts (once).

    False when this torch has no logging registry to join (the logger then works as a plain one).
    """
    global _registered, _compile_log
    if _registered:
        return True
    try:
        _internal = _import_torch_logging()
    except ImportError:
        return False
    try:
        _internal.register_log(LOG, list(QUALIFIED_NAMES))
        _internal.register_artifact(
            COMPILE_ARTIFACT,
            "Kernel compiles of python_native's DSL backends: op, variant, dispatch key, seconds.",
            off_by_default=False,
        )
        _compile_log = _internal.getArtifactLogger(f"{LOG}.compile", COMPILE_ARTIFACT)
    except Exception:  # a torch whose registry differs: never a reason to fail the import
        log.debug("python_native: torch's logging registry refused our names", exc_info=True)
        return False
    _registered = True
    _apply_env(_internal, env.torch_logs())
    return True


def _import_torch_logging() -> Any:
    """torch's logging registry. Where torch is not imported yet, its import parses ``TORCH_LOGS``
    before our names exist and would refuse them: it runs with them left out of the setting."""
    if "torch" in sys.modules:
        from torch._logging import _internal
        return _internal
    with env.torch_logs_without((LOG, COMPILE_ARTIFACT, *QUALIFIED_NAMES)):
        from torch._logging import _internal
    return _internal


def _requested(setting: str) -> tuple[int | None, bool]:
    """``(level asked for python_native or None, whether the compile artifact is asked for)``."""
    level, artifact = None, False
    for token in setting.split(","):
        token = token.strip()
        name = token.lstrip("+-")
        if name == LOG or name in QUALIFIED_NAMES:
            level = logging.DEBUG if token.startswith("+") else logging.ERROR if token.startswith("-") else logging.INFO
        elif name == COMPILE_ARTIFACT:
            artifact = True
    return level, artifact


def _apply_env(internal: Any, setting: str) -> None:
    """Configure our loggers as torch will for ``setting``, so records of this very import show."""
    level, artifact = _requested(setting)
    if level is None and not artifact:
        return
    for name in QUALIFIED_NAMES:
        logger = logging.getLogger(name)
        logger.setLevel(level if level is not None else logging.WARNING)
        logger.propagate = False
        if not any(internal._is_torch_handler(h) for h in logger.handlers):
            internal._setup_handlers(logging.StreamHandler, logger)
    if artifact:
        _compile_log.setLevel(logging.DEBUG)
        _compile_log.propagate = True


def compile_logging() -> bool:
    """Whether compile events are shown now (callers skip timing their compiles otherwise)."""
    return _compile_log.isEnabledFor(logging.DEBUG)


def kernel_compiled(dsl: str, op: str, dispatch_key: str, seconds: float, kernel: str, *,
                    variant: str = "default", detail: str = "") -> None:
    """One compile event: ``dsl``'s ``kernel`` for ``op`` built for ``dispatch_key`` in ``seconds``."""
    _compile_log.debug(
        "python_native: %s compiled %s for op %s (variant %s) at %s in %.3f s%s",
        dsl, kernel, op, variant, dispatch_key, seconds, f" ({detail})" if detail else "",
    )


register_with_torch()  # at import: the package is imported inside ``import torch``, before TORCH_LOGS is read
