"""torch.compile and torch.export support: ``pn.compile_mode`` and opaque override ops."""

from typing import Any

from python_native.features.compiled.mode import MODES, check_mode, describe, get, mode_set, set_mode, sync

__all__ = ["MODES", "check_mode", "decomposition_table", "describe", "get", "mode_set", "opaque_op", "opaque_table", "set_mode", "sync"]

_OPAQUE = ("decomposition_table", "opaque_op", "opaque_table")  # loaded on first use: ``import torch`` needs none


def __getattr__(name: str) -> Any:
    if name not in _OPAQUE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from python_native.features.compiled import opaque

    globals()[name] = value = getattr(opaque, name)
    return value
