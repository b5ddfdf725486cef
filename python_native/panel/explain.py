"""``pn.explain(op, *args)``: the whole chain a call with these arguments goes through right now.

A reader who wants to know what runs for ``torch.softmax`` would otherwise follow eight layers by
hand: the dispatch front, the generated router, each override's cond with the features' wrappers
around it, the impl wrappers, and the kernel at the end. This puts them in one place, asked of the
live registry, without running the op: each cond is asked (a cond plans, it launches nothing), the
features' wrappers around it are asked only for their ``explain``, and no impl is called.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from python_native.core import explainers, extensions
from python_native.core.registry import REGISTRY
from python_native.features import front
from python_native.foundations import schema
from python_native.foundations.dispatch_keys import check_str


@dataclass(frozen=True)
class Step:
    """One override of the slot, as the router meets it."""

    name: str
    active: bool
    off: str | None  # the switch that keeps it out of routing, where inactive
    cond_layers: tuple[str, ...]  # outermost first: "<feature>: <function>", ending with the override's own cond
    accepts: bool | None  # None: inactive, or not reached (an earlier override takes the call)
    reason: str | None  # why it declines (or why asking its cond failed)
    impl_layers: tuple[str, ...]  # outermost first, ending with the kernel function
    kernel: str  # module:qualname of the function the impl layers end in


@dataclass(frozen=True)
class Explanation:
    """What ``pn.explain`` found; ``print`` it to read the chain top to bottom."""

    op: str  # lib::op.overload
    dispatch_key: str
    front: str  # which dispatch front serves the slot and how
    replay: str
    router_source: str | None  # None: no override was ever registered here
    steps: tuple[Step, ...] = field(default_factory=tuple)
    runs: str = ""  # the override that serves the call, or aten's kernel and why
    override: str | None = None  # the name of the override that serves the call (None: aten's kernel)

    def __str__(self) -> str:
        lines = [f"{self.op} at {self.dispatch_key}", f"  front: {self.front}", f"  replay: {self.replay}"]
        if self.router_source is not None:
            lines.append("  router:")
            lines += [f"    | {line}" for line in self.router_source.rstrip("\n").splitlines()]
        for i, step in enumerate(self.steps, 1):
            lines.append(f"  override {i}: {step.name}" + ("" if step.active else f" (inactive: {step.off})"))
            lines += [f"    cond {layer}" for layer in step.cond_layers]
            if step.accepts is not None:
                lines.append(f"    -> {'accepts' if step.accepts else 'declines'}"
                             + (f": {step.reason}" if step.reason else ""))
            lines += [f"    impl {layer}" for layer in step.impl_layers]
        lines.append(f"  runs: {self.runs}")
        return "\n".join(lines)


def explain(op: Any, *args: Any, **kwargs: Any) -> Explanation:
    """The chain a call of ``op`` (an op symbol such as ``"_softmax"``, ``"aten::add.Tensor"``, or an
    ``OpOverload``) with ``args``/``kwargs`` (the op's own arguments) goes through now."""
    lib, symbol = _op_of(op)
    key = _dispatch_key(args, kwargs, lib, symbol)
    with REGISTRY.lock:
        slot = _slot_of(lib, symbol, key)
        sig = slot.sig if slot is not None else _signature(lib, symbol)
        values = _bind(sig, args, kwargs, f"{lib}::{symbol}")
        if slot is None:
            return Explanation(f"{lib}::{symbol}", key, _front_text(None), _replay_text(None), None,
                               runs=f"aten's kernel: no override of {lib}::{symbol} was ever registered at {key}")
        steps, runs = _steps(slot, values)
        serving = next((s.name for s in steps if s.accepts), None)
        return Explanation(f"{lib}::{slot.sig.qualified}", key, _front_text(slot), _replay_text(slot),
                           slot.current_source, tuple(steps), runs, serving)


def _op_of(op: Any) -> tuple[str, str]:
    """``(lib, op symbol)`` of what the user named; a clear error for anything that names no op."""
    if isinstance(op, torch._ops.OpOverload):
        return op.namespace, schema.qualify(op._schema.name.split("::", 1)[1], op._overloadname)
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name.split("::", 1)[0], op.__name__.split(".")[-1]
    if not isinstance(op, str):
        raise TypeError(f"explain takes an op symbol (e.g. '_softmax', 'aten::add.Tensor') or an OpOverload, "
                        f"got {type(op).__name__}: {op!r}")
    lib, _, symbol = check_str(op, "op").rpartition("::")
    lib = lib or "aten"
    packet = schema.split_symbol(symbol)[0]
    named = schema.find_overload(lib, symbol) if "." in symbol else getattr(getattr(torch.ops, lib), packet, None)
    if not packet.isidentifier() or named is None:
        raise ValueError(f"explain: {op!r} names no operator: expected an op symbol such as '_softmax' or "
                         "'aten::add.Tensor' (lib::packet.overload, the lib 'aten' unless given)")
    return lib, symbol


def _dispatch_key(args: tuple, kwargs: dict, lib: str, symbol: str) -> str:
    """The backend key a call on these arguments reaches (CPU, CUDA, ...): its first tensor's device."""
    for value in (*args, *kwargs.values()):
        tensors = value if isinstance(value, (list, tuple)) else (value,)
        for t in tensors:
            if isinstance(t, torch.Tensor):
                return "CUDA" if t.device.type == "cuda" else t.device.type.upper()
    raise ValueError(f"explain: the arguments of {lib}::{symbol} hold no tensor, so no dispatch key follows "
                     "from them; pass the op's arguments as the call would (tensors included)")


def _slot_of(lib: str, symbol: str, key: str) -> Any:
    """The slot serving ``lib::symbol`` at ``key``; a packet without overload matches its one slot there."""
    packet, overload = schema.split_symbol(symbol)
    found = REGISTRY.slots.get((lib, schema.qualify(packet, overload), key))
    if found is not None or "." in symbol:
        return found
    same = [s for (l_, _, k), s in REGISTRY.slots.items() if l_ == lib and k == key and s.sig.packet == packet]
    if len(same) > 1:
        raise ValueError(f"explain: {lib}::{symbol} has several overloads with overrides at {key} "
                         f"({sorted(s.sig.qualified for s in same)}); name one")
    return same[0] if same else None


def _front_text(slot: Any) -> str:
    found = front.describe()
    text = found["front"] + (f" ({found['why']})" if found["why"] and found["front"] == "python" else "")
    if slot is not None and found["front"] == "compiled":
        mode = found["slots"].get(slot.label, "python")
        text += {"fallback": ": every call of this slot goes to aten's kernel without entering Python",
                 "gated": ": calls every gate surely declines go to aten's kernel there, the rest to the router",
                 "python": ": every call of this slot enters the router"}.get(mode, f": mode {mode}")
    return text


def _replay_text(slot: Any) -> str:
    if front.current() != "compiled":
        return "off (the compiled front is not serving)"
    found = front.replay.describe()
    if not found["on"]:
        return f"off ({found['why']})"
    stats = found["slots"].get(slot.label) if slot is not None else None
    if stats and stats.get("replaying"):
        return "on for this slot: a call whose key it recorded is served from its launches, never by the router"
    return "on, but not for this slot (it is traced, inactive, or an override's impl is not replayable)"


def _signature(lib: str, symbol: str) -> schema.OpSignature | None:
    """The op's signature, or None for a packet named without its overload that has no default one."""
    try:
        return schema.signature_of(lib, symbol)
    except ValueError:
        return None


def _bind(sig: schema.OpSignature | None, args: tuple, kwargs: dict, name: str) -> tuple[tuple, dict, dict | None]:
    """``(args, kwargs, every parameter's value with defaults filled in)``; an error where they do not
    fit the schema. The values are None where the signature is not spelled out (the router takes
    ``*args, **kwargs`` then, and so does the cond)."""
    if sig is None or not sig.explicit:
        return args, kwargs, None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [inspect.Parameter(p.name, kinds[p.kwarg_only], default=p.default if p.has_default else inspect.Parameter.empty)
              for p in sig.params]
    try:
        bound = inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"explain: these arguments do not fit {name}'s schema: {e}") from None
    bound.apply_defaults()
    return args, kwargs, dict(bound.arguments)


def _call(sig: schema.OpSignature, epilogue: str, given: tuple[tuple, dict, dict | None]) -> tuple[tuple, dict]:
    """The arguments as the router hands them to a cond: every parameter, defaults filled in."""
    args, kwargs, values = given
    if values is None:
        return args, kwargs
    positional = tuple(values[p.name] for p in sig.positional)
    keywords = {p.schema_name: values[p.name] for p in sig.keyword_only if not (epilogue == "out" and p.is_out)}
    return positional, keywords


def _named(fn: Any) -> str:
    target = fn.func if hasattr(fn, "func") and callable(getattr(fn, "func", None)) else fn
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{qualname}"


def _layers(routed: Any) -> tuple[tuple[str, ...], Any]:
    """Each layer of a routed cond or impl as ``"<feature>: <function>"``, and what they end in."""
    peeled = extensions.layers(routed)
    texts = tuple(f"{feature or 'own'}: {_named(layer)}" for feature, layer in peeled)
    return texts, peeled[-1][1]


def _steps(slot: Any, given: tuple[tuple, dict, dict | None]) -> tuple[list[Step], str]:
    steps: list[Step] = []
    runs: str | None = None
    declines: list[str] = []
    for o in slot.overrides:
        active = o in slot.active
        cond_layers = _layers(o.routed_cond)[0] if o.routed_cond is not None else ("none: unconditional",)
        impl_layers, kernel = _layers(o.routed_impl)
        accepts = reason = None
        if active and runs is None:
            accepts, reason = _judge(o, *_call(slot.sig, o.epilogue, given))
            if accepts:
                runs = f"{o.name}, ending in {_named(kernel)}"
            else:
                declines.append(reason)
        steps.append(Step(o.name, active, None if active else explainers.why_off(o), cond_layers, accepts, reason,
                          impl_layers, _named(kernel)))
    if runs is None:
        why = explainers.fallback_reason(slot, declines) or "no override is active"
        runs = f"aten's kernel ({slot.shadowed or 'the kernel below'}): {why}"
    return steps, runs


def _judge(o: Any, args: tuple, kwargs: dict) -> tuple[bool, str | None]:
    """Whether the routed cond of ``o`` takes the call, and why not, asking no wrapper to run it."""
    if o.cond is None:
        return True, None
    try:
        own = bool(o.cond(*args, **kwargs))
    except Exception as e:  # the router would raise it to the caller: say so
        return False, f"{o.dsl}: its cond raised {type(e).__name__}: {e}"
    if not own:
        return False, explainers.explainer(o)(*args, **kwargs)
    wrapped = o.routed_cond is not o.cond and callable(getattr(o.routed_cond, "explain", None))
    if wrapped:  # a wrapper's explain covers its own declines and defers to the override's for the rest
        theirs = explainers.explainer(o)(*args, **kwargs)
        mine = _own_explain(o, args, kwargs)
        if theirs != mine and theirs != f"{o.dsl}: {explainers.DECLINED}":
            return False, theirs
    return True, None


def _own_explain(o: Any, args: tuple, kwargs: dict) -> str | None:
    """What the override's own explainer says of the call, as ``explainers.explainer`` words it."""
    if o.explain is None:
        return None
    try:
        text = o.explain(*args, **kwargs)
    except Exception as e:
        return f"{o.dsl}: {explainers.DECLINED} (its explanation raised {type(e).__name__}: {e})"
    return f"{o.dsl}: {text or explainers.DECLINED}"
