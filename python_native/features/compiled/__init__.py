"""torch.compile and torch.export support: ``pn.compile_mode`` and opaque override ops."""

from python_native.features.compiled.mode import MODES, check_mode, describe, get, mode_set, set_mode, sync
from python_native.features.compiled.opaque import decomposition_table, opaque_op, opaque_table

__all__ = ["MODES", "check_mode", "decomposition_table", "describe", "get", "mode_set", "opaque_op", "opaque_table", "set_mode", "sync"]
