"""Resolve op symbols to overloads (aten's or another namespace's) and describe their Python-level signatures.

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


# (lib, op) -> (torch's object for the op, its signature): an op destroyed and defined again (maybe
# with another schema) has a new object, so it is described anew, never from its old definition.
_signatures: dict[tuple[str, str], tuple[torch._ops.OpOverload, OpSignature]] = {}


def signature_of(lib_symbol: str, op_symbol: str) -> OpSignature:
    """Describe ``lib_symbol::op_symbol`` as defined now; raises ``ValueError`` if it does not exist."""
    overload = find_overload(lib_symbol, op_symbol)
    if overload is None:
        raise ValueError(f"{lib_symbol}::{op_symbol} does not exist")
    known = _signatures.get((lib_symbol, op_symbol))
    if known is not None and known[0] is overload:
        return known[1]
    sig = _describe(overload._schema, op_symbol)
    _signatures[(lib_symbol, op_symbol)] = (overload, sig)
    return sig


def _describe(schema: torch._C.FunctionSchema, op_symbol: str) -> OpSignature:
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


_FUNCTIONALITY_PREFIXES = ("SparseCsr", "Sparse", "Quantized", "Mkldnn")


def autograd_key_of(dispatch_key: str) -> str:
    """The autograd key serving a backend key: ``CPU`` and ``SparseCPU`` → ``AutogradCPU``."""
    if dispatch_key.startswith("NestedTensor"):
        return "AutogradNestedTensor"
    backend = dispatch_key
    for prefix in _FUNCTIONALITY_PREFIXES:
        if backend.startswith(prefix) and backend != prefix:
            backend = backend[len(prefix):]
            break
    candidate = f"Autograd{backend}"
    return candidate if candidate in torch._C.DispatchKey.__members__ else "AutogradOther"


def _computed_kind(full: str, runtime_key: str) -> str | None:
    """How the dispatcher fills ``runtime_key`` for ``full`` now: ``"math kernel"``, ``"autograd kernel"``, ..."""
    prefix = f"{runtime_key}:"
    for line in torch._C._dispatch_dump_table(full).splitlines():
        if line.startswith(prefix) and line.endswith("]"):
            return line[line.rindex("[") + 1:-1]
    return None


def autograd_would_change(lib_symbol: str, op_symbol: str, dispatch_key: str) -> bool:
    """True when a kernel at ``dispatch_key`` would change which kernel autograd runs for the op.

    For an op with a CompositeImplicitAutograd kernel and no kernel of its own at the backend,
    autograd runs the decomposition (each piece records its own gradient). A backend kernel flips
    the backend's autograd key to the op's registered autograd kernel, whose derivative may call a
    backward op that has no kernel there (``linear_backward`` on CPU). Only an op whose autograd key
    already runs a real autograd kernel is safe to override at a backend key.
    """
    full = f"{lib_symbol}::{op_symbol}"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd"):
        return False
    return _computed_kind(full, autograd_key_of(dispatch_key)) == "math kernel"


def decomposition_ops(lib_symbol: str, op_symbol: str) -> list[str]:
    """Best effort: the ops the composite kernel of ``lib_symbol::op_symbol`` calls, in first-call order.

    Runs the decomposition once on small meta tensors built from the schema; an op whose
    arguments cannot be made up that way gives ``[]``.
    """
    overload = find_overload(lib_symbol, op_symbol)
    if overload is None:
        return []
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: dict[str, None] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[qualify(func.overloadpacket.__name__, func._overloadname)] = None
            return func(*args, **(kwargs or {}))

    for rank in (2, 4, 3):
        args = _meta_args(overload._schema, rank)
        if args is None:
            return []
        recorder = _Recorder()
        try:
            with recorder:
                overload.decompose(*args)
        except Exception:
            continue
        return list(recorder.ops)
    return []


def _meta_args(schema: torch._C.FunctionSchema, rank: int) -> list[Any] | None:
    args: list[Any] = []
    for arg in schema.arguments:
        if arg.kwarg_only or arg.has_default_value():
            break
        kind = str(arg.type)
        if kind in ("Tensor", "Optional[Tensor]", "Tensor?"):
            args.append(torch.ones((2,) * rank, device="meta"))
        elif "int[" in kind.lower() or "list[int]" in kind.lower() or "list[symint]" in kind.lower():
            args.append([2] * (rank - 2 or 1))
        elif kind in ("int", "SymInt"):
            args.append(1)
        elif "float" in kind:
            args.append(1e-5)
        else:
            return None
    return args
