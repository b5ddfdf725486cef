"""Resolve op symbols to aten overloads and describe their Python-level signatures.

The generated routers take the op's own parameters, so this module turns a
``torch._C.FunctionSchema`` into parameter lists (names, defaults, keyword-only) once,
at registration time.
"""

from __future__ import annotations

import difflib
import keyword
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

OVERRIDABLE_NAMESPACES = ("aten",)


@dataclass(frozen=True)
class Param:
    """One schema argument as the router receives it."""

    name: str  # Python identifier used in generated code
    schema_name: str
    kwarg_only: bool
    has_default: bool
    default: Any
    is_out: bool  # a mutable keyword-only tensor that receives a result (``out=``)
    mutable: bool
    # "Tensor" or "Tensor?": may arrive as a Python number when the user passed one (``x * 2``).
    tensor: bool


@dataclass(frozen=True)
class OpSignature:
    """Everything the code generator needs to know about one overload."""

    qualified: str  # "add.Tensor", or "bmm" for a default overload
    packet: str  # "add"
    overload: str  # "Tensor" or "default"
    params: tuple[Param, ...]
    n_returns: int
    # False when a keyword-only argument is a Python keyword: the router then takes **kwargs.
    explicit: bool

    @property
    def positional(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.kwarg_only)

    @property
    def keyword_only(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kwarg_only)


def split_symbol(op_symbol: str) -> tuple[str, str]:
    """``"add.Tensor"`` → ``("add", "Tensor")``; ``"bmm"`` → ``("bmm", "default")``."""
    packet, _, overload = op_symbol.partition(".")
    return packet, overload or "default"


def qualify(packet: str, overload: str) -> str:
    return packet if overload == "default" else f"{packet}.{overload}"


def find_overload(lib_symbol: str, op_symbol: str) -> torch._ops.OpOverload | None:
    """The OpOverload ``lib_symbol::op_symbol``, or None when it does not exist."""
    packet, overload = split_symbol(op_symbol)
    if not packet or not packet.isidentifier():
        return None
    try:
        packet_obj = getattr(getattr(torch.ops, lib_symbol), packet)
        return getattr(packet_obj, overload)
    except (AttributeError, RuntimeError):
        return None


@cache
def _all_op_names(lib_symbol: str) -> tuple[str, ...]:
    prefix = f"{lib_symbol}::"
    names = set()
    for full in torch._C._dispatch_get_all_op_names():
        if full.startswith(prefix):
            name = full[len(prefix):]
            packet, overload = split_symbol(name)
            names.add(packet)
            names.add(qualify(packet, overload))
    return tuple(sorted(names))


def close_op_names(lib_symbol: str, op_symbol: str, n: int = 3) -> list[str]:
    """Existing op names that look like ``op_symbol`` (for error messages)."""
    return difflib.get_close_matches(op_symbol, _all_op_names(lib_symbol), n=n, cutoff=0.7)


def op_exists(lib_symbol: str, name: str) -> bool:
    """Whether ``name`` (bare packet or qualified overload) names an op in the namespace."""
    if "." in name:
        return find_overload(lib_symbol, name) is not None
    try:
        getattr(getattr(torch.ops, lib_symbol), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _python_name(name: str, taken: set[str]) -> str:
    candidate = name if name.isidentifier() and not keyword.iskeyword(name) else f"{name}_"
    while candidate in taken or candidate.startswith("_pn_"):
        candidate += "_"
    return candidate


@cache
def signature_of(lib_symbol: str, op_symbol: str) -> OpSignature:
    """Describe ``lib_symbol::op_symbol``; raises ``ValueError`` if it does not exist."""
    overload = find_overload(lib_symbol, op_symbol)
    if overload is None:
        raise ValueError(f"{lib_symbol}::{op_symbol} does not exist")
    schema = overload._schema
    params: list[Param] = []
    taken: set[str] = set()
    explicit = True
    for arg in schema.arguments:
        if arg.kwarg_only and (keyword.iskeyword(arg.name) or not arg.name.isidentifier()):
            explicit = False
        name = _python_name(arg.name, taken)
        taken.add(name)
        mutable = bool(arg.alias_info is not None and arg.alias_info.is_write)
        params.append(
            Param(
                name=name,
                schema_name=arg.name,
                kwarg_only=arg.kwarg_only,
                has_default=arg.has_default_value(),
                default=arg.default_value if arg.has_default_value() else None,
                is_out=bool(arg.kwarg_only and mutable and schema.is_mutable),
                mutable=mutable,
                tensor=str(arg.type) in ("Tensor", "Optional[Tensor]", "Tensor?"),
            )
        )
    packet, overload_name = split_symbol(op_symbol)
    return OpSignature(
        qualified=qualify(packet, overload_name),
        packet=packet,
        overload=overload_name,
        params=tuple(params),
        n_returns=len(schema.returns),
        explicit=explicit,
    )


def is_composite_implicit_only(lib_symbol: str, op_symbol: str) -> bool:
    """True when the op decomposes above autograd, so a backend-key kernel would bypass autograd.

    Such an op (``aten::rms_norm``, say) has a CompositeImplicitAutograd kernel and no autograd
    kernel of its own: installing a backend kernel would make autograd skip its decomposition.
    """
    full = f"{lib_symbol}::{op_symbol}"
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if not has(full, "CompositeImplicitAutograd"):
        return False
    # An op whose autograd comes only from the composite kernel has nothing at Autograd
    # beyond that alias; one with a derivative formula (``_fused_rms_norm``) has its own.
    return not _has_own_autograd_kernel(full)


def _has_own_autograd_kernel(full: str) -> bool:
    dump = torch._C._dispatch_dump(full)
    for line in dump.splitlines():
        head = line.split(":", 1)[0].strip()
        if head.startswith("Autograd") and "CompositeImplicitAutograd" not in line:
            return True
    return False
