"""Enable state of DSLs, ops, dispatch keys and the whole panel: explicit switches plus scoped holds.

A name is off while the most recent scope holding it says off (``operations_disabled``), on while
it says on (``operations_enabled``), and, with no scope holding it, while it is explicitly disabled.
Scopes hold tokens rather than counts, so an explicit ``enable_*`` can lift every hold at once and a
scope that exits afterwards removes only its own token, never a hold taken later by someone else;
an explicit ``disable_*`` lifts the holds that keep the name on. Tokens only grow, so the most
recent hold is the last one recorded.

Every change ends by recomputing ``off`` for each name it touched from ``explicit`` and ``holds``,
so a change cut short (an asynchronous exception between two names) is repaired by running it
again: every mutation here is idempotent. Mutations happen under the registry's lock; reads are
plain set and dict lookups.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

KINDS = ("dsl", "op", "key", "all")
ALL = "python_native"  # the one name of kind "all": the master switch, ``pn.enabled``


class Switch:
    """The state of one kind of name (DSL names, op symbols, dispatch keys, or the master switch)."""

    def __init__(self) -> None:
        self.explicit: set[str] = set()
        self.holds: dict[str, dict[int, bool]] = {}  # name -> {token: off}, in token order
        self.off: set[str] = set()  # the names off now, kept up to date for one-lookup reads

    def is_off(self, name: str) -> bool:
        return name in self.off

    def _update(self, name: str) -> None:
        holds = self.holds.get(name)
        if holds:
            off = holds[next(reversed(holds))]
        else:
            off = name in self.explicit
        if off:
            self.off.add(name)
        else:
            self.off.discard(name)

    def disable(self, names: Iterable[str]) -> None:
        for name in names:
            self.explicit.add(name)
            holds = self.holds.get(name)
            if holds:
                for token in [t for t, off in holds.items() if not off]:
                    del holds[token]
                if not holds:
                    del self.holds[name]
            self._update(name)

    def enable(self, names: Iterable[str]) -> None:
        for name in names:
            self.explicit.discard(name)
            self.holds.pop(name, None)
            self._update(name)

    def hold(self, names: Iterable[str], token: int, off: bool = True) -> None:
        for name in names:
            holds = self.holds.setdefault(name, {})
            holds[token] = off
            if token == next(reversed(holds)):  # the newest hold decides (tokens only grow)
                self.off.add(name) if off else self.off.discard(name)
            else:  # a token taken earlier, held again (a retried enter): recompute
                self._update(name)

    def release(self, names: Iterable[str], token: int) -> None:
        for name in names:
            holds = self.holds.get(name)
            if holds is not None:
                holds.pop(token, None)
                if not holds:
                    self.holds.pop(name, None)
            self._update(name)

    def held(self, token: int) -> bool:
        """Whether ``token`` still holds some name (a scope's hold not lifted by an explicit switch)."""
        return any(token in holds for holds in self.holds.values())

    def clear(self) -> None:
        self.explicit.clear()
        self.holds.clear()
        self.off.clear()


class Switches:
    """One ``Switch`` per kind, and the tokens scopes hold them with."""

    def __init__(self) -> None:
        self.dsl = Switch()
        self.op = Switch()
        self.key = Switch()
        self.all = Switch()
        self._tokens = itertools.count(1)

    def of(self, kind: str) -> Switch:
        return getattr(self, kind)

    def new_token(self) -> int:
        return next(self._tokens)

    def clear(self) -> None:
        for kind in KINDS:
            self.of(kind).clear()
