"""The names users type for the overridden ops, and the aten ops each of them covers.

PyTorch users know ``softmax`` and ``layer_norm``; the overrides sit on the aten ops those call
(``_softmax``, ``native_layer_norm``) and on their backwards. Each backend family declares, per
override, the public name of the op and whether the aten op is that op's backward (see
``python_native_dsls.spec.OverrideSpec``). One rule follows, for every switch and predicate:

- a public name (``"softmax"``) covers every aten op declared under it, forward and backward;
- the name of a declared forward (``"_softmax"``) covers the same ops as its public name;
- the name of a declared backward (``"_softmax_backward_data"``) covers just that op;
- any other name covers itself;
- every op also covers the in-place and ``out=`` forms derived from it (the registry's rule).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from python_native.foundations import custom_ops as _custom_ops


@dataclass
class _Group:
    """The aten ops declared under one public name."""

    forward: dict[str, None] = field(default_factory=dict)  # ordered sets
    backward: dict[str, None] = field(default_factory=dict)

    def ops(self) -> tuple[str, ...]:
        return (*self.forward, *self.backward)


_groups: dict[str, _Group] = {}
_forwards: dict[str, set[str]] = {}  # a declared forward's name and bare name -> the public names it is declared under
_lock = threading.Lock()
generation = 0  # bumped by every change: callers cache expansions per generation


def _packet(op: str) -> str:
    return op.partition(".")[0]


def declare(public_name: str, op: str, *, backward: bool = False) -> None:
    """Declare that ``public_name`` (``"softmax"``) covers aten ``op`` (``"_softmax"``); ``backward``
    says ``op`` is that op's backward (its own name then covers just itself)."""
    global generation
    for what, value in (("public_name", public_name), ("op", op)):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    if not public_name.isidentifier():
        raise ValueError(f"public_name {public_name!r} must be an identifier, as the op's name in torch is (e.g. 'softmax')")
    op = op.partition("::")[2] or op
    if op.endswith(".default"):
        op = op[: -len(".default")]
    with _lock:
        group = _groups.setdefault(public_name, _Group())
        known = op in group.forward or op in group.backward
        (group.backward if backward else group.forward)[op] = None
        if not backward:
            for name in (op, _packet(op)):
                _forwards.setdefault(name, set()).add(public_name)
        if not known:
            generation += 1


def covered(name: str) -> tuple[str, ...]:
    """The aten ops ``name`` covers by the rule above; ``()`` when the table does not know it
    (a backward's name, or an op no family declared: it covers itself)."""
    if _custom_ops.deferred:  # the package's own ops declare their names on first use
        _custom_ops.load_deferred()
    publics = [name] if name in _groups else []
    publics += sorted(_forwards.get(name, ()))
    ops: dict[str, None] = {}
    for public in publics:
        ops.update(dict.fromkeys(_groups[public].ops()))
    return tuple(ops)


def is_public(name: str) -> bool:
    """Whether ``name`` is a declared public name."""
    if _custom_ops.deferred:  # the package's own ops declare their names on first use
        _custom_ops.load_deferred()
    return name in _groups


def groups() -> dict[str, tuple[str, ...]]:
    """Every public name with the aten ops declared under it (forwards first)."""
    if _custom_ops.deferred:  # the package's own ops declare their names on first use
        _custom_ops.load_deferred()
    with _lock:
        return {public: group.ops() for public, group in sorted(_groups.items())}



def public_name_of(op: str) -> str | None:
    """The public name ``op`` is declared under (the first, when several declare it), or None."""
    if _custom_ops.deferred:  # the package's own ops declare their names on first use
        _custom_ops.load_deferred()
    with _lock:
        for public, group in sorted(_groups.items()):
            if op in group.forward or op in group.backward:
                return public
    return None
