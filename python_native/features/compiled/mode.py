"""The compile mode and Inductor's decomposition tables: how overrides meet ``torch.compile`` and ``torch.export``: ``pn.compile_mode``.

Compiled code never reaches the backend-key routers by itself: AOTAutograd traces on
FakeTensors and Inductor decomposes and lowers aten ops into its own kernels. Two modes:

* ``"bypass"`` (default): compiled graphs hold Inductor's kernels; eager code keeps routing.
* ``"keep"``: each aten overload with an override becomes an opaque ``python_native::<op>``
  custom op in the compiled graph (through Inductor's decomposition table). At run time that
  op calls the aten op through the dispatcher, so the router decides then, and scopes such as
  ``pn.triton.disabled()`` apply to already compiled functions without recompiling.

The mode is read when a function is compiled: switching it does not touch graphs already built.
"""

from __future__ import annotations

from typing import Any

import torch

from python_native.core import extensions
from python_native.core.registry import REGISTRY
from python_native.foundations import interrupts

MODES = ("bypass", "keep")

_mode = "bypass"
_installed: dict[Any, list[Any]] = {}  # aten op -> each Inductor table's own entry, to restore
_MISSING = object()


def _lock() -> Any:
    """The registry's lock: registrations call ``sync`` while holding it, so one lock order only."""
    return REGISTRY.lock


def check_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"compile_mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def get() -> str:
    """The current mode: ``"bypass"`` or ``"keep"``."""
    return _mode


def set_mode(mode: str) -> None:
    """Switch the mode for functions compiled from now on (``pn.compile_mode = mode``)."""
    global _mode
    mode = check_mode(mode)
    with _lock():
        _mode = mode
        sync()


class mode_set:  # noqa: N801  (used like a function: ``with pn.compile_mode_set("keep"):``)
    """Context manager: ``mode`` inside the block, the previous mode afterwards (checked on creation)."""

    def __init__(self, mode: str) -> None:
        self.mode = check_mode(mode)
        self._previous: list[str] = []

    def __enter__(self) -> None:
        # As the switches' scopes (see ``interrupts``): the change is the last step, undone when cut short.
        previous = _mode
        try:
            self._previous.append(previous)
            set_mode(self.mode)
        except BaseException:
            self._restore(previous)
            raise

    @interrupts.unpolled_entry
    def __exit__(self, *exc: object) -> None:
        previous = self._previous[-1]
        try:
            self._restore(previous)
        except BaseException:
            self._restore(previous)  # an interrupt cut it short: finish it
            raise

    def _restore(self, previous: str) -> None:
        """Set ``previous`` again and forget it: idempotent."""
        set_mode(previous)
        for i in range(len(self._previous) - 1, -1, -1):
            if self._previous[i] is previous:
                del self._previous[i]
                break


# ----- Inductor's decomposition tables -----


def _inductor_tables() -> list[dict[Any, Any]]:
    from torch._inductor import decomposition

    tables = [decomposition.decompositions]
    fast = getattr(decomposition, "fast_random_decomps", None)
    if fast is not None:
        tables.append(fast())  # cached: the same dict every compile reads
    return tables


def sync() -> None:
    """Make Inductor's decomposition tables match the mode and the registered overrides.

    Called on every mode change and whenever overrides are registered or removed (the dispatch
    core tells it: see the listener below). Entries
    this module replaced are restored to Inductor's own when they leave the table.
    """
    with _lock():
        if _mode != "keep" and not _installed:
            return  # nothing installed, nothing to do: importing Inductor stays lazy in bypass
        from python_native.features.compiled import opaque

        wanted = opaque.opaque_table() if _mode == "keep" else {}
        tables = _inductor_tables()
        for aten_op in list(_installed):
            if aten_op not in wanted:
                originals = _installed.pop(aten_op)
                for table, original in zip(tables, originals, strict=True):
                    if original is _MISSING:
                        table.pop(aten_op, None)
                    else:
                        table[aten_op] = original
        for aten_op, twin in wanted.items():
            if aten_op in _installed:
                continue
            _installed[aten_op] = [table.get(aten_op, _MISSING) for table in tables]
            for table in tables:
                table[aten_op] = twin
        _tag_caches(sorted(op.name() for op in _installed))


_tag_suffix = ""


def _tag_caches(ops: list[str]) -> None:
    """Give compile caches a key that differs per set of opaque ops.

    The on-disk AOTAutograd cache keys on the graph before decomposition, so without this a
    graph built in one mode could be served in the other.
    """
    global _tag_suffix
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return
    base = config.cache_key_tag
    if _tag_suffix and base.endswith(_tag_suffix):
        base = base[: -len(_tag_suffix)]
    _tag_suffix = f"|python_native.keep:{','.join(ops)}" if ops else ""
    config.cache_key_tag = base + _tag_suffix


def describe() -> dict[str, Any]:
    """The compile mode and what it currently turns into opaque ops, as plain data."""
    from python_native.features.compiled import opaque

    with _lock():
        return {
            "mode": _mode,
            "modes": list(MODES),
            "in_compiled_graphs": sorted(op.name() for op in _installed),
            **opaque.describe(),
        }


# "keep" follows the overridden ops; the status section is ``pn.status()["compile"]``.
extensions.register(extensions.Hooks("compile mode", overrides_changed=sync, status=describe, status_key="compile"))
