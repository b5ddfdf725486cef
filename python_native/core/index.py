"""The state index: which slots answer to each DSL name, op name and dispatch key.

Switches name DSLs, ops and keys; a toggle refreshes only the slots the index lists under the
names it changed, so its cost does not grow with the number of slots.
"""

from __future__ import annotations

from collections.abc import Iterable

from python_native.core.handles import OverrideHandle
from python_native.core.slots import Slot
from python_native.foundations.switches import ALL, KINDS


def names_of(o: OverrideHandle, kind: str) -> tuple[str, ...]:
    """The names ``o`` answers to for one kind of switch."""
    if kind == "dsl":
        return (o.dsl,)
    if kind == "key":
        return (o.dispatch_key,)
    if kind == "all":
        return (ALL,)
    return o.op_names


class NameIndex:
    """Slots by kind and name; kept in step with the slots' overrides."""

    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str, set[Slot]]] = {kind: {} for kind in KINDS}

    def add(self, o: OverrideHandle, slot: Slot) -> None:
        for kind in KINDS:
            for name in names_of(o, kind):
                self.by_kind[kind].setdefault(name, set()).add(slot)

    def reindex(self, slot: Slot) -> None:
        """Drop ``slot`` from names none of its remaining overrides answers to."""
        for kind in KINDS:
            index = self.by_kind[kind]
            for name, slots in list(index.items()):
                if slot in slots and not any(name in names_of(o, kind) for o in slot.overrides):
                    slots.discard(slot)
                    if not slots:
                        del index[name]

    def slots(self, kind: str, names: Iterable[str]) -> Iterable[Slot]:
        """The slots some override of which answers to one of ``names``."""
        index = self.by_kind[kind]
        if len(names) == 1:  # the common case: one name, no set to build
            return index.get(names[0], ())
        return {s for n in names for s in index.get(n, ())}

    def op_names(self) -> dict[str, set[Slot]]:
        return self.by_kind["op"]
