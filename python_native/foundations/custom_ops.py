"""Custom ops: operators outside aten, in the ``python_native`` namespace, that overrides attach to.

aten has no operator for some fusions a DSL kernel can do (a linear layer and its cross-entropy
loss, whose logits are never materialised). ``declare`` defines one through ``torch.library``:

- its schema;
- a *reference* implementation in plain torch, registered at ``CompositeExplicitAutograd``: it
  fills every backend key, so it is the kernel a call runs when no override fires, and the one an
  override falls back to (the dispatch core captures it like any aten kernel);
- a *fake* kernel, for FakeTensors (``torch.compile``, ``torch.export``): shapes and dtypes only;
- optionally autograd (``backward`` and ``setup_context``, as ``torch.library.register_autograd``
  takes them), or instead a *composite* body (``CompositeImplicitAutograd``: a thin op that calls
  others, differentiated through them).

Overrides then register at a backend key exactly as for an aten op, with
``lib_symbol="python_native"``, and shadow the reference there; switches, scopes, traces,
calibration, checked mode and compile modes apply unchanged.

Names: ``pn.compile_mode = "keep"`` defines opaque twins of overridden aten ops in the same
namespace under the aten ops' own names (``python_native::_softmax``). A custom op therefore
takes a name no aten op has, and a twin whose name a custom op holds is never defined. The one
exception is asked for by name (``aten_namesake=True``): an aten op that is only a composite
(``aten::rms_norm`` calls ``_fused_rms_norm``) has no kernel of its own for an override to sit on,
so it never needs a twin, and the custom op may share its name (and so its public name).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

NAMESPACE = "python_native"

log = logging.getLogger("python_native")


@dataclass(frozen=True)
class CustomOp:
    """One custom op overload, for the status report."""

    name: str  # qualified: "linear_cross_entropy" or "linear_cross_entropy.forward"
    schema: str
    kind: str  # "reference" (a kernel of its own) or "composite" (calls other ops)
    autograd: bool
    doc: str
    # The plain-torch kernel of a "reference" op (None for a composite): what serves when no override
    # fires, and what a stand-in override can compute without calling the op.
    reference: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    @property
    def packet(self) -> str:
        return self.name.partition(".")[0]


_lock = threading.Lock()
_ops: dict[str, CustomOp] = {}
_libraries: list[torch.library.Library] = []  # kept alive: destroying one takes its op out
# Loaders that declare ops when something first asks for them (the package's own ops: ``import torch``
# does not pay for them). Each is idempotent (an import), so a thread that finds one running waits on it.
deferred: list[Callable[[], Any]] = []
_loading = threading.local()  # set while this thread runs the deferred loaders


def declare_on_first_use(load: Callable[[], Any]) -> None:
    """Run ``load()`` (it declares ops) the first time a custom op or a public name is looked up:
    ``torch.ops.python_native.<name>``, ``defined()``, ``is_custom_op`` or ``public_names``."""
    if load not in deferred:
        deferred.append(load)
    namespace = getattr(torch.ops, NAMESPACE)
    if not isinstance(namespace, _DeclaringNamespace):
        namespace.__class__ = _DeclaringNamespace


def load_deferred() -> None:
    """Run the loaders ``declare_on_first_use`` keeps (once each; one that raises is logged).

    A loader's own declarations (and torch's lookups of the namespace while it defines them) come
    back here on the same thread: those return at once, the loader being under way."""
    if getattr(_loading, "active", False):
        return
    _loading.active = True
    try:
        for load in list(deferred):
            try:
                load()
            except Exception:
                log.exception("python_native: declaring ops on first use failed (%r)", load)
            with contextlib.suppress(ValueError):  # another thread finished it first
                deferred.remove(load)
    finally:
        _loading.active = False


class _DeclaringNamespace(torch._ops._OpNamespace):
    """``torch.ops.python_native``: a name it does not have yet runs the deferred loaders first."""

    # torch names each op's module after its namespace's (``torch._ops.python_native``), and Inductor
    # writes generated code from that name: it must stay torch's.
    __module__ = torch._ops._OpNamespace.__module__

    def __getattr__(self, op_name: str) -> Any:
        try:
            return super().__getattr__(op_name)
        except AttributeError:
            if not deferred or op_name.startswith("__"):
                raise
        load_deferred()
        return super().__getattr__(op_name)


def _qualified_name(schema: str) -> str:
    head = schema.partition("(")[0].strip()
    packet, _, overload = head.partition(".")
    if not packet.isidentifier() or (overload and not overload.isidentifier()) or overload == "default":
        raise ValueError(f"schema {schema!r}: the op name must be 'name' or 'name.overload' (identifiers)")
    return head


def declare(
    schema: str,
    *,
    reference: Callable[..., Any] | None = None,
    fake: Callable[..., Any] | None = None,
    composite: Callable[..., Any] | None = None,
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
    doc: str = "",
    aten_namesake: bool = False,
) -> torch._ops.OpOverload:
    """Define ``python_native::<schema>`` and return its ``OpOverload``.

    Give either ``reference`` (with ``fake``, and optionally ``backward`` with ``setup_context``)
    or ``composite``. Raises ``ValueError`` for a name that is declared already, or that aten has
    (unless ``aten_namesake`` and aten's op is only a composite: see the module's docstring).
    """
    name = _qualified_name(schema)
    packet = name.partition(".")[0]
    if (reference is None) == (composite is None):
        raise ValueError(f"{NAMESPACE}::{name}: give either reference= (a kernel) or composite= (a body), not both")
    if reference is not None and fake is None:
        raise ValueError(f"{NAMESPACE}::{name}: a reference kernel needs fake= (shapes for torch.compile/export)")
    if (backward is None) != (setup_context is None):
        raise ValueError(f"{NAMESPACE}::{name}: autograd needs both backward= and setup_context=")
    if composite is not None and backward is not None:
        raise ValueError(f"{NAMESPACE}::{name}: a composite op is differentiated through the ops it calls")
    if deferred:  # the package's own ops first: torch looks the namespace up while it defines, under our lock
        load_deferred()
    if aten_namesake:
        _check_namesake(name, packet)
    elif _aten_has_packet(packet):
        raise ValueError(
            f"{NAMESPACE}::{name}: aten has an op named {packet!r}; a custom op takes a name aten lacks "
            f"(the opaque twins of compile mode 'keep' use aten's names in this namespace)"
        )
    with _lock:
        if name in _ops:
            raise ValueError(f"{NAMESPACE}::{name} is declared already")
        library = torch.library.Library(NAMESPACE, "FRAGMENT")
        qualified = f"{NAMESPACE}::{name}"
        try:
            library.define(schema)
            if composite is not None:
                library.impl(name, composite, "CompositeImplicitAutograd")
            else:
                library.impl(name, reference, "CompositeExplicitAutograd")
                torch.library.register_fake(qualified, fake, lib=library)
                if backward is not None:
                    torch.library.register_autograd(qualified, backward, setup_context=setup_context, lib=library)
        except BaseException:
            library._destroy()
            raise
        _libraries.append(library)
        _ops[name] = CustomOp(name, schema, "composite" if composite is not None else "reference",
                               backward is not None, doc, reference)
    log.debug("python_native: custom op %s defined (%s)", qualified, _ops[name].kind)
    overload = name.partition(".")[2] or "default"
    return getattr(getattr(getattr(torch.ops, NAMESPACE), packet), overload)


def _aten_has_packet(packet: str) -> bool:
    """Whether aten has any overload named ``packet.*`` (``add`` has no default overload)."""
    try:
        getattr(torch.ops.aten, packet)
    except (AttributeError, RuntimeError):
        return False
    return True


def _check_namesake(name: str, packet: str) -> None:
    """``ValueError`` unless every overload of ``aten::packet`` is a composite alone (no kernel an
    override or a compile-mode twin could take)."""
    overloads = [n for n in torch._C._dispatch_get_all_op_names()
                 if n == f"aten::{packet}" or n.startswith(f"aten::{packet}.")]
    has_kernel = [n for n in overloads if not torch._C._dispatch_has_kernel_for_dispatch_key(n, "CompositeImplicitAutograd")]
    if not overloads or has_kernel:
        raise ValueError(
            f"{NAMESPACE}::{name}: aten_namesake=True needs an aten op {packet!r} that is only a composite; "
            + (f"{', '.join(has_kernel)} has kernels of its own" if overloads else f"aten has no op {packet!r}")
        )


def defined() -> list[CustomOp]:
    """Every custom op overload, in the order they were defined."""
    if deferred:
        load_deferred()
    with _lock:
        return list(_ops.values())


def is_custom_op(name: str) -> bool:
    """Whether ``name`` (``"packet"`` or ``"packet.overload"``) is a custom op of this namespace."""
    if deferred:
        load_deferred()
    with _lock:
        return name in _ops or any(op.packet == name for op in _ops.values())
