"""``pn._get_filter_state()``: the switches as torch's in-tree panel exposes them to its tests.

torch's ``torch.backends.python_native`` keeps three sets of disabled names (``_dsl_names``,
``_op_symbols``, ``_dispatch_keys``) and its own test suite reads and writes them directly (saving,
clearing and restoring them around each test). Here each is a live view of one kind of switch,
with the same meaning: the names off now; adding a name disables it, discarding one enables it
(lifting scopes that hold it, as ``enable_*`` does), and the dispatcher follows at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableSet

from python_native.core.registry import REGISTRY


class SwitchView(MutableSet):
    """The names of one kind of switch that are off now, as a mutable set."""

    def __init__(self, kind: str) -> None:
        self._kind = kind

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and REGISTRY.is_off(self._kind, name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(REGISTRY.switches.of(self._kind).off))  # a snapshot: changing while iterating is fine

    def __len__(self) -> int:
        return len(REGISTRY.switches.of(self._kind).off)

    def add(self, name: str) -> None:
        REGISTRY.disable(self._kind, (_checked(name),))

    def discard(self, name: str) -> None:
        REGISTRY.enable(self._kind, (_checked(name),))

    def update(self, *others: Iterable[str]) -> None:
        names = tuple(_checked(n) for other in others for n in other)
        if names:
            REGISTRY.disable(self._kind, names)

    def clear(self) -> None:
        names = tuple(REGISTRY.switches.of(self._kind).off)
        if names:
            REGISTRY.enable(self._kind, names)

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, self))}}}" if len(self) else "set()"


def _checked(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"switch names are str, got {type(name).__name__}: {name!r}")
    return name


class FilterState:
    """What torch's panel calls its filter state: the disabled DSLs, ops and dispatch keys."""

    def __init__(self) -> None:
        self._dsl_names = SwitchView("dsl")
        self._op_symbols = SwitchView("op")
        self._dispatch_keys = SwitchView("key")

    def __repr__(self) -> str:
        return f"FilterState(dsls={self._dsl_names!r}, ops={self._op_symbols!r}, keys={self._dispatch_keys!r})"


FILTER_STATE = FilterState()
