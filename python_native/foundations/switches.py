"""Enable state of DSLs, ops and dispatch keys: explicit disables plus reference-counted scopes.

A name is disabled while it is explicitly disabled or while any scope holds it. Scopes hold
tokens rather than counts, so an explicit ``enable_*`` can lift every hold at once and a scope
that exits afterwards removes only its own token, never a hold taken later by someone else.
Mutations happen under the registry's lock; reads are plain set and dict lookups.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

KINDS = ("dsl", "op", "key")


class Switch:
    """The disable state of one kind of name (DSL names, op symbols or dispatch keys)."""

    def __init__(self) -> None:
        self.explicit: set[str] = set()
        self.holds: dict[str, set[int]] = {}
        self.off: set[str] = set()  # explicit | holds, kept up to date for one-lookup reads

    def is_off(self, name: str) -> bool:
        return name in self.off

    def _update(self, name: str) -> None:
        if name in self.explicit or name in self.holds:
            self.off.add(name)
        else:
            self.off.discard(name)

    def disable(self, names: Iterable[str]) -> None:
        for name in names:
            self.explicit.add(name)
            self.off.add(name)

    def enable(self, names: Iterable[str]) -> None:
        for name in names:
            self.explicit.discard(name)
            self.holds.pop(name, None)
            self.off.discard(name)

    def hold(self, names: Iterable[str], token: int) -> None:
        for name in names:
            self.holds.setdefault(name, set()).add(token)
            self.off.add(name)

    def release(self, names: Iterable[str], token: int) -> None:
        for name in names:
            tokens = self.holds.get(name)
            if tokens is not None:
                tokens.discard(token)
                if not tokens:
                    del self.holds[name]
                self._update(name)

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
        self._tokens = itertools.count(1)

    def of(self, kind: str) -> Switch:
        return getattr(self, kind)

    def new_token(self) -> int:
        return next(self._tokens)

    def clear(self) -> None:
        for kind in KINDS:
            self.of(kind).clear()
