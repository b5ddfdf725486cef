"""Choosing override variants by op name: ``set_override_variant``, ``override_variant``, ``get_override_variant``.

Ops are named as the op switches take them (``"softmax"`` covers ``_softmax`` and its backward,
``"aten::bmm"``, ``torch.ops.aten.bmm``...). Setting a variant on a name sets it on every
functional override the name covers that declares it (``"default"`` and ``"aten"`` every one);
derived in-place/``out=`` overrides follow. The choice is process-wide, like the switches.
"""

from __future__ import annotations

import contextlib
from typing import Any

from python_native.core import variants
from python_native.core.handles import OverrideHandle
from python_native.core.registry import REGISTRY
from python_native.foundations import interrupts, uncompiled
from python_native.panel import bootstrap as _bootstrap
from python_native.panel.controller import op_names


def overrides_of(op: Any, what: str) -> list[OverrideHandle]:
    """The functional overrides ``op`` covers, in routing order; ``ValueError`` when there is none."""
    _bootstrap.apply_env_changes()
    names = set(op_names((op,), what))
    found = dict.fromkeys(o.functional for o in REGISTRY.overrides() if not names.isdisjoint(o.op_names))
    if not found:
        raise ValueError(
            f"{what}: no override of {op!r} is registered, so it has no variants; "
            "pn.operation_names() lists the overridden ops"
        )
    return list(found)


def _targets(op: Any, name: Any, what: str) -> list[OverrideHandle]:
    """The overrides ``op`` covers that accept variant ``name``; ``ValueError`` naming the declared ones."""
    if not isinstance(name, str):
        raise TypeError(f"{what}: a variant name must be a str or None, got {type(name).__name__}: {name!r}")
    handles = overrides_of(op, what)
    targets = [o for o in handles if name in variants.names(o)]
    if not targets:
        declared = list(dict.fromkeys(v for o in handles for v in o.variants))
        raise ValueError(
            f"{what}: {op!r} has no variant {name!r}; declared: {declared} "
            f"(and {variants.ATEN!r}, the original kernel)"
        )
    return targets


@uncompiled.opaque
def set_override_variant(op: Any, name: str | None) -> None:
    """Make the overrides of ``op`` run variant ``name`` from now on (None: ``"default"``;
    ``"aten"``: the original kernel, the overrides pass every call through)."""
    name = variants.DEFAULT if name is None else name
    with REGISTRY.lock:
        for o in _targets(op, name, "set_override_variant"):
            variants.choose(REGISTRY, o, name)


@uncompiled.opaque
def get_override_variant(op: Any) -> str:
    """The variant the first override of ``op`` (in routing order) runs now."""
    return overrides_of(op, "get_override_variant")[0].variant


def variants_of(op: Any) -> dict[str, list[str]]:
    """Each override of ``op`` (by name) with its declared variants."""
    return {o.name: list(o.variants) for o in overrides_of(op, "variants_of")}


class VariantScope(contextlib.ContextDecorator):
    """Runs variant ``name`` of ``op``'s overrides inside the block (or decorated call), and
    restores each override's previous choice on exit, whether the body raised or not."""

    def __init__(self, op: Any, name: str | None):
        self._op = op
        self._name = variants.DEFAULT if name is None else name
        _targets(op, self._name, "override_variant")  # a bad name fails here, not at the first entry
        self._saved: list[tuple[list[tuple[OverrideHandle, str]], Any]] = []  # per entry, with its Dynamo pause

    @uncompiled.entering
    def __enter__(self) -> VariantScope:
        # As the switches' scopes (see ``interrupts``): the choice is the last step, undone when cut short.
        entry = None
        try:
            entry = ([], uncompiled.pause())  # the block runs outside compiled graphs, as the switches' scopes do
            self._saved.append(entry)
            with REGISTRY.lock:
                targets = _targets(self._op, self._name, "override_variant")
                entry[0].extend((o, o.variant) for o in targets)
                for o in targets:
                    variants.choose(REGISTRY, o, self._name)
        except BaseException:
            if entry is not None:
                self._restore(entry)
            raise
        return self

    @uncompiled.entering
    @interrupts.unpolled_entry
    def __exit__(self, *exc_info: object) -> None:
        interrupts.undo_last(self, self._saved, self._restore)

    def _restore(self, entry: tuple[list[tuple[OverrideHandle, str]], Any]) -> None:
        """Put back each override's previous choice, forget ``entry``, resume Dynamo: idempotent."""
        saved, paused = entry
        with REGISTRY.lock:
            for o, previous in saved:
                if not o.removed:
                    variants.choose(REGISTRY, o, previous)
        for i in range(len(self._saved) - 1, -1, -1):
            if self._saved[i] is entry:
                del self._saved[i]
                break
        uncompiled.resume(paused)

    def __repr__(self) -> str:
        return f"<python_native scope running variant {self._name!r} of {self._op!r}>"


@uncompiled.opaque
def override_variant(op: Any, name: str | None) -> VariantScope:
    """Context manager or decorator: the overrides of ``op`` run variant ``name`` inside the block."""
    return VariantScope(op, name)
