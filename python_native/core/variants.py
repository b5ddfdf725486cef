"""Variants: several impls of one override, and which one its router calls.

An override declares its variants at registration (``"default"`` is its ``impl``; ``"aten"`` is
reserved: the original kernel). Choosing one rebinds the override's globals in its slot's
namespace (``_pn_impl_<uid>``, through the features' impl wrappers like any impl, and the trace
event naming the variant) and refreshes the slot: the router's code is the same, so a call pays
nothing for the choice. Choosing ``"aten"`` takes the override out of the active list
(``Registry.refresh`` skips it), so the router goes straight to the next override or the kernel.
Derived in-place/``out=`` overrides follow the functional override's choice.

``PYTHON_NATIVE_VARIANTS`` seeds the choice of each override as it registers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from python_native.core import extensions, routers
from python_native.core.handles import Impl, OverrideHandle
from python_native.foundations import env, faults, public_names

log = logging.getLogger("python_native")

DEFAULT = "default"
ATEN = "aten"  # reserved: the original kernel, the override passes every call through


def check(impl: Impl, variants: Any) -> dict[str, Impl]:
    """The declared variants, ``"default"`` (``impl``) first; ``TypeError``/``ValueError`` naming a
    bad entry otherwise."""
    declared: dict[str, Impl] = {DEFAULT: impl}
    if variants is None:
        return declared
    if not isinstance(variants, Mapping):
        raise TypeError(f"variants must be a dict of name -> impl, got {type(variants).__name__}: {variants!r}")
    for name, fn in variants.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"variant names must be identifiers (e.g. 'split'), got {name!r}")
        if name == ATEN:
            raise ValueError("the variant name 'aten' is reserved: it always means the original kernel")
        if not callable(fn):
            raise TypeError(f"variant {name!r} must be callable, got {type(fn).__name__}: {fn!r}")
        if name == DEFAULT and fn is not impl:
            raise ValueError("variant 'default' is the impl argument; give the other impl another name")
        declared[name] = fn
    return declared


def names(handle: OverrideHandle) -> tuple[str, ...]:
    """Every name ``handle`` accepts: its declared variants, then ``"aten"``."""
    return (*handle.variants, ATEN)


def routed_impl(handle: OverrideHandle) -> Impl:
    """The chosen variant's impl as the router calls it (through every impl wrapper)."""
    return extensions.routed_impl(handle)


def choose(registry: Any, handle: OverrideHandle, name: str) -> None:
    """Make ``handle`` (a functional override) and its derived overrides run variant ``name``."""
    if name not in names(handle):
        raise ValueError(
            f"override {handle.name} has no variant {name!r}; declared: {list(handle.variants)} "
            f"(and {ATEN!r}, the original kernel)"
        )
    with registry.lock:
        for o in (handle, *handle.derived):
            if o.variant == name:
                continue
            o.variant = name
            if o._removed:
                continue
            o.routed_impl = routed_impl(o)
            routers.bind(o._slot, o)
            registry.refresh(o._slot)


# ----- PYTHON_NATIVE_VARIANTS -----

_seeds: list[tuple[str, str]] | None = None


def seeds() -> list[tuple[str, str]]:
    """The ``(op, variant)`` entries of ``PYTHON_NATIVE_VARIANTS``, read once (at import, as the
    built-in overrides register)."""
    global _seeds
    if _seeds is None:
        _seeds = env.variant_choices()
    return _seeds


def _entry_op(entry: str, lib: str) -> str | None:
    """The op name an entry names in namespace ``lib`` (``"aten::bmm.default"`` → ``"bmm"``), None if
    it names another namespace."""
    namespace, sep, rest = entry.partition("::")
    if sep:
        if namespace != lib:
            return None
        entry = rest
    return entry[: -len(".default")] if entry.endswith(".default") else entry


def matches(handle: OverrideHandle, op: str) -> bool:
    """Whether an op name (as the switches take it, a public name included) covers ``handle``."""
    name = _entry_op(op, handle.lib)
    if name is None:
        return False
    return name in handle.op_names or handle.op in public_names.covered(name)


def seeded(handle: OverrideHandle, others: Callable[[], list[OverrideHandle]]) -> str | None:
    """The variant ``PYTHON_NATIVE_VARIANTS`` chooses for ``handle`` (its last matching entry that
    ``handle`` accepts), or None. An entry no override it matches accepts (``handle`` nor ``others()``,
    the registered ones) is reported; one a later override accepts is no problem any more."""
    chosen = None
    for op, name in seeds():
        if not matches(handle, op):
            continue
        source = f"{env.VARIANTS[0]} ({op})"
        if name in names(handle):
            chosen = name
            faults.resolve(source)
        elif not any(name in names(o) for o in others() if matches(o, op)):
            faults.report(
                source, f"{handle.name} has no variant {name!r}; declared: {list(handle.variants)} (and {ATEN!r})",
                "name a declared variant; the override runs its default meanwhile", stacklevel=4,
            )
    return chosen


def seed(registry: Any, handle: OverrideHandle) -> None:
    """Apply ``PYTHON_NATIVE_VARIANTS`` to a registered ``handle`` (again after its public name was
    declared: entries may name the op by it)."""
    name = seeded(handle, registry.overrides)
    if name is not None and name != handle.variant:
        choose(registry, handle, name)
