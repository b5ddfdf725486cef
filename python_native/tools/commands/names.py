"""One naming scheme for every command's ``--op``: the names the panel's switches take.

A user may type a public name (``softmax``, ``layer_norm``), an aten op's name (``_softmax``,
``sum.dim_IntList``) or its bare name (``sum``), in repeated options or comma lists alike
(``--op softmax --op gelu``, ``--op softmax,gelu``). The rule is the panel's
(``python_native.foundations.public_names``): a public name and its aten forward's name cover the
forward and its backward, a backward's name covers itself, a bare name every overload declared.

The names are known from what the built-in libraries declare (whether or not their DSL runs here)
and from every override registered in this process, so ``softmax`` is never "unknown" on a
machine that merely cannot run it: that is answered as such. Each command then maps the aten ops
to what it selects: installed overrides (``verify``), benchmark rows (``bench``, ``inspect``),
CuTe DSL specializations (``precompile``), calibration cells (``calibration``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from python_native.tools.commands.usage import UsageError


def listed(values: Sequence[str] | str | None) -> list[str]:
    """Repeated option values and comma lists alike, in order, once each: ``["a,b", "a"]`` -> ``["a", "b"]``."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return list(dict.fromkeys(name.strip() for value in values for name in value.split(",") if name.strip()))


LIBRARIES = {"triton": "python_native_dsls.triton.ops", "cutedsl": "python_native_dsls.cutedsl.ops"}


def _library_specs(dsl: str) -> list:
    """Every ``OverrideSpec`` built-in library ``dsl`` declares (its families'), whether or not it runs here."""
    try:
        families = importlib.import_module(LIBRARIES[dsl]).families()
    except Exception:  # a broken backend costs only its own names
        return []
    return [spec for family in families for spec in family.specs]


def library_names(dsl: str, lib: str = "aten") -> list[str]:
    """The names the panel takes for the ``lib`` ops built-in library ``dsl`` overrides: each public
    name, and the op's own name where it has none (what ``pn.operation_names()`` lists once installed)."""
    return sorted({spec.public_name or spec.op for spec in _library_specs(dsl) if spec.lib == lib})


def _library_declarations() -> list[tuple[str, str | None, bool]]:
    """``(aten op, public name, is a backward)`` for every override the built-in libraries declare."""
    return [(spec.op, spec.public_name, spec.backward) for dsl in LIBRARIES for spec in _library_specs(dsl)]


def _registered_declarations() -> list[tuple[str, str | None, bool]]:
    """The same for every override registered in this process (third-party DSLs included)."""
    import python_native as pn
    from python_native.foundations import public_names

    found = []
    for o in pn.overrides():
        if o.derived_from is None:
            public = public_names.public_name_of(o.op)
            found.append((o.op, public, public is not None and o.op not in public_names.covered(o.op)))
    return found


@dataclass(frozen=True)
class Catalogue:
    """Every name a user may type for an op with the aten ops it covers (``names``), and the public
    name each aten op is declared under (``public_of``)."""

    names: dict[str, tuple[str, ...]]
    public_of: dict[str, str]

    def shown(self, ops: Iterable[str]) -> tuple[str, ...]:
        """The names to list for ``ops``: their public names, then the ops that have none."""
        ops = list(dict.fromkeys(ops))
        return (tuple(sorted({self.public_of[op] for op in ops if op in self.public_of}))
                + tuple(op for op in ops if op not in self.public_of))


def catalogue() -> Catalogue:
    """The names of every op the built-in libraries declare and every override registered here."""
    declarations = _library_declarations() + _registered_declarations()
    groups: dict[str, dict[str, None]] = {}
    for op, public, _ in declarations:
        if public is not None:
            groups.setdefault(public, {})[op] = None
    table: dict[str, dict[str, None]] = {public: dict(ops) for public, ops in groups.items()}
    for op, public, backward in declarations:
        cover = groups[public] if public is not None and not backward else {op: None}
        for name in dict.fromkeys((op, op.partition(".")[0])):
            table.setdefault(name, {}).update(cover)
    public_of = {op: public for op, public, _ in declarations if public is not None}
    return Catalogue({name: tuple(ops) for name, ops in sorted(table.items())}, public_of)


@dataclass(frozen=True)
class Choice:
    """What ``option`` accepts for one command: each name with the command's own targets it selects.

    ``what`` names a target ("installed override"), ``shown`` the names an error lists."""

    option: str
    targets: dict[str, tuple[str, ...]]
    what: str
    shown: tuple[str, ...]
    note: str = ""  # why a known name may select nothing here (how to change that)

    def resolve(self, values: Sequence[str] | str | None) -> list[str] | None:
        """The targets ``values`` select, in order (None when no name is given); ``UsageError``
        naming the first name that selects nothing, with close matches."""
        names = listed(values)
        if not names:
            return None
        selected: dict[str, None] = {}
        for name in names:
            hit = self.targets.get(name)
            if not hit:
                raise UsageError(self._refusal(name))
            selected.update(dict.fromkeys(hit))
        return list(selected)

    def _refusal(self, name: str) -> str:
        shown = ", ".join(self.shown) or "none"
        if name in self.targets:
            note = f" ({self.note})" if self.note else ""
            return f"{self.option} {name!r}: no {self.what} covers it{note}; allowed: {shown}"
        close = difflib.get_close_matches(name, sorted(self.targets), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        return f"{self.option} {name!r} unknown (no op is named so); {hint}allowed: {shown}"


def for_ops(option: str, ops: Iterable[str], what: str, note: str = "") -> Choice:
    """``option`` selecting among the aten ``ops`` (installed overrides, specializations...)."""
    ops = tuple(dict.fromkeys(ops))
    names = catalogue()
    table = dict(names.names)
    for op in ops:  # an op no library declares (registered elsewhere) still answers to its names
        for name in (op, op.partition(".")[0]):
            table.setdefault(name, (op,))
    available = set(ops)
    targets = {name: tuple(op for op in covered if op in available) for name, covered in table.items()}
    return Choice(option, targets, what, names.shown(ops), note)


def for_rows(option: str, rows: Sequence[str], what: str = "benchmark row") -> Choice:
    """``option`` selecting benchmark rows: a row's own name (``gelu_tanh``, ``sum_dim0``) selects
    it; any other op name, every row reaching one of the aten ops it covers (the rows the op
    families name in their ``bench=`` declarations)."""
    from python_native.tools.bench.rows import row_symbols

    reached = row_symbols()
    targets: dict[str, tuple[str, ...]] = {}
    for name, covered in catalogue().names.items():
        targets[name] = tuple(row for row in rows if set(reached.get(row, ())) & set(covered))
    targets.update({row: (row,) for row in rows})
    return Choice(option, targets, what, tuple(rows))
