"""``pn.reach(model, *inputs)``: one training step, and per module class what ran where.

It patches the model for the step (unless told not to, or patched already), attributes every
routed call to the innermost module it ran in (forward hooks set the module scope of the modules
no rule patched; patched ones set their own; the custom ops' backwards keep their forward's),
runs a forward and a backward under ``pn.trace()``, and tables per module class:

- ``override``: routed calls an override served;
- ``fallback``: routed calls that ran aten's kernel or a custom op's reference, each reason listed;
- ``outside``: calls of modules (or of the functions they call) that a rule recognises but that
  computed outside the package: left alone (with the reason), not patched for this step, handed
  back by a patched forward to the module's own code (with the shape or dtype its probe did not
  confirm), and an MoE's experts and routers, recognised by structure, that no rule took. A
  module whose own calls reached the routers of its rule's ops (a LayerNorm that ``F.layer_norm``
  routes) is not outside; no call is counted twice.

It is how a user sees what the package reaches in a model before measuring it. The model's
gradients are put back as they were after the step.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from python_native.core.registry import REGISTRY
from python_native.foundations import custom_ops, module_scope, public_names
from python_native.patching import installer, reach_table
from python_native.patching.report import PatchReport

BACKWARD = "(backward, no module)"
OUTSIDE_MODULES = "(outside any module)"
PATCH_DECLINED = "patch: "  # the reason a patched forward gives when it hands a call back (runtime.declined)


@dataclasses.dataclass
class ReachRow:
    """One module class: its instances, forward calls, and the routed calls attributed to them."""

    module_class: str
    instances: int = 0
    calls: int = 0
    override: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # op -> calls
    fallback: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (op, reason) -> calls
    outside: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (rule, why) -> calls


@dataclasses.dataclass
class ReachReport:
    """What ``pn.reach`` saw: rows per module class, the patch report, ops no override serves here."""

    model: str
    patch: PatchReport
    rows: dict[str, ReachRow]
    unserved: list[str]  # custom ops the patch routes to that have no override at the step's key
    key: str

    def totals(self) -> tuple[int, int, int]:
        rows = self.rows.values()
        return (sum(sum(r.override.values()) for r in rows), sum(sum(r.fallback.values()) for r in rows),
                sum(sum(r.outside.values()) for r in rows))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "key": self.key, "patch": self.patch.to_dict(), "unserved": self.unserved,
            "rows": [{"module_class": r.module_class, "instances": r.instances, "calls": r.calls,
                      "override": dict(r.override), "fallback": [{"op": op, "reason": why, "calls": n}
                                                                 for (op, why), n in r.fallback.items()],
                      "outside": [{"rule": rule, "why": why, "calls": n} for (rule, why), n in r.outside.items()]}
                     for r in self.rows.values()],
        }

    def table(self) -> str:
        return reach_table.render(self)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__


def _loss(output: Any, loss: Callable[[Any], torch.Tensor] | None) -> torch.Tensor:
    """What the step differentiates: ``loss(output)``, the output's ``loss``, or the mean of its first tensor."""
    if loss is not None:
        return loss(output)
    value = getattr(output, "loss", None)
    if isinstance(value, torch.Tensor):
        return value
    for candidate in (getattr(output, "logits", None), output, *(output if isinstance(output, (tuple, list)) else ())):
        if isinstance(candidate, torch.Tensor) and candidate.is_floating_point():
            return candidate.float().mean()
    raise TypeError(f"pn.reach: cannot find a loss in the model's output ({type(output).__name__}); pass loss=")


class _Attribution:
    """Forward hooks on every module: the module scope for unpatched modules, and a call count."""

    def __init__(self, model: nn.Module):
        self.calls: collections.Counter = collections.Counter()
        self.names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
        self._stack: list[str | None] = []
        self._handles = []
        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._exit, always_call=True))

    def _enter(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        self.calls[name] += 1
        self._stack.append(module_scope.scope.name)
        module_scope.scope.name = name

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        module_scope.scope.name = self._stack.pop() if self._stack else None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _step(model: nn.Module, inputs: tuple, kwargs: dict, loss: Callable | None) -> tuple[list, int, collections.Counter]:
    """One forward and backward under a trace: the events, how many the forward made, the calls per
    module. The model's gradients are restored afterwards."""
    grads = [(p, p.grad) for p in model.parameters()]
    attribution = _Attribution(model)
    previous = module_scope.scope.name
    try:
        with REGISTRY.trace() as trace:
            value = _loss(model(*inputs, **kwargs), loss)
            forward_events = len(trace.events)
            value.backward()
    finally:
        attribution.remove()
        module_scope.scope.name = previous
        for p, grad in grads:
            p.grad = grad
    return list(trace.events), forward_events, attribution.calls


def _device_key(model: nn.Module) -> str:
    p = next(model.parameters(), None)
    return "CPU" if p is None or p.device.type == "cpu" else p.device.type.upper()


def _unserved(events: list, key: str) -> list[str]:
    """The custom ops the step called with no override installed at ``key`` (forwards seen in the
    trace, and the backwards declared with them)."""
    called = {e.op for e in events if (e.reason or "").startswith(f"no override of {custom_ops.NAMESPACE}::")}
    mine = {d.name for d in custom_ops.defined()}
    ops = {op for name in called for op in (name, *public_names.covered(name.partition(".")[0]))} & mine
    return sorted(op for op in ops if not getattr(REGISTRY.slots.get((custom_ops.NAMESPACE, op, key)), "overrides", None))


def _stacked_experts(module: nn.Module) -> int:
    """The experts of a module that stacks them: own 3-D parameters (at least two) with one
    leading dim E > 1, a gated MLP per expert (``gate_up_proj``/``down_proj`` whatever their
    names); 0 otherwise."""
    stacked = [p.shape[0] for p in module._parameters.values() if p is not None and p.dim() == 3]
    return stacked[0] if len(stacked) >= 2 and stacked[0] > 1 and len(set(stacked)) == 1 else 0


def _mlp_list(module: nn.Module) -> int:
    """The experts of a ModuleList of MLPs (modules of one class, each of two or three ``nn.Linear``
    children: gated or not); 0 otherwise."""
    items = list(module.children()) if isinstance(module, nn.ModuleList) else []
    if len(items) < 2 or len({type(m) for m in items}) != 1:
        return 0
    linears = [sum(isinstance(c, nn.Linear) for c in m.children()) for m in items]
    return len(items) if all(n in (2, 3) for n in linears) else 0


def _router_of(parent: nn.Module, skip: nn.Module, experts: int) -> list[nn.Module]:
    """The children of an MoE block that score its ``experts``: a 2-D weight of ``experts`` rows."""
    return [child for child in parent.children() if child is not skip
            and any(p is not None and p.dim() == 2 and p.shape[0] == experts for p in child._parameters.values())]


EXPERTS = ("moe experts", "an MoE's experts (an MLP per expert, {}): no rule took them; their own code ran")
ROUTER = ("moe router", "an MoE's router (scores over {} experts, then top-k): no rule took it; its own code ran")


def _moe(model: nn.Module) -> dict[int, tuple[str, str]]:
    """id(module) -> (label, why) for every MoE experts module and router, recognised by structure."""
    found: dict[int, tuple[str, str]] = {}
    for parent in model.modules():
        for child in parent.children():
            stacked, listed = _stacked_experts(child), _mlp_list(child)
            if stacked:
                found[id(child)] = (EXPERTS[0], EXPERTS[1].format(f"{stacked} stacked in 3-D parameters"))
            for expert in child.children() if listed else ():
                found[id(expert)] = (EXPERTS[0], EXPERTS[1].format(f"{listed} in a ModuleList"))
            for router in _router_of(parent, child, stacked or listed) if stacked or listed else ():
                found[id(router)] = (ROUTER[0], ROUTER[1].format(stacked or listed))
    return found


def _label(entry: Any) -> str:
    return entry.rule if entry.kind == "module" else f"{entry.rule} ({entry.target.rpartition('.')[2]})"


def _declined_by(report: PatchReport, module: str | None, op: str) -> str:
    """The label of the rule patched in ``module`` that hands ``op``'s calls back: the one routing
    that op, else the only one patched there, else the op itself."""
    there = [e for e in report.entries if e.status == "patched" and module in e.modules]
    public = public_names.public_name_of(op) or op
    routing = [e for e in there if public in e.ops or op in e.ops]
    chosen = routing or (there if len(there) == 1 else [])
    return _label(chosen[0]) if chosen else op


def _routed_ops(entry: Any) -> set[str]:
    return {op for public in entry.ops for op in (public, *public_names.covered(public))}


def _count_events(row: Callable[[str], ReachRow], classes: dict, report: PatchReport, events: list,
                  forward_events: int) -> None:
    """Served and fell-back calls per class; a call a patched forward handed back to the module's
    own code (its shape or dtype unconfirmed) is counted outside, under the rule that declined it."""
    for i, e in enumerate(events):
        cls = classes.get(e.module, BACKWARD if i >= forward_events else OUTSIDE_MODULES)
        reason = e.reason or "-"
        if e.outcome == "override":
            row(cls).override[e.op] += 1
        elif reason.startswith(PATCH_DECLINED):
            label = _declined_by(report, e.module, e.op)
            row(cls).outside[(label, reach_table.HANDED_BACK + reason[len(PATCH_DECLINED):])] += 1
        else:
            row(cls).fallback[(e.op, reason)] += 1


def _count_outside(row: Callable[[str], ReachRow], model: nn.Module, report: PatchReport, events: list,
                   calls: collections.Counter) -> None:
    """Calls of modules a rule recognises but left alone (or the step did not patch), and of MoE
    experts and routers no rule took. An instance whose own calls reached the routers of the
    rule's ops is not outside (a LayerNorm that ``F.layer_norm`` routes), and none counts twice."""
    named = {n or type(model).__name__: m for n, m in model.named_modules()}
    reached = collections.defaultdict(set)
    for e in events:
        reached[e.module].add(e.op)
    counted: set[str] = set()
    for entry in report.entries:
        if entry.status == "patched":
            counted.update(entry.modules)
            continue
        why = entry.detail if entry.status == "left alone" else "not patched for this step (pn.patch would route it)"
        ops = _routed_ops(entry)
        for name in entry.modules:
            if name in named and calls.get(name) and not reached[name] & ops and (name, entry.rule) not in counted:
                counted.update((name, (name, entry.rule)))
                row(type(named[name]).__name__).outside[(_label(entry), why)] += calls[name]
    moe = _moe(model)
    for name, module in named.items():
        if id(module) in moe and name not in counted and calls.get(name):
            row(type(module).__name__).outside[moe[id(module)]] += calls[name]


def _rows(model: nn.Module, report: PatchReport, events: list, forward_events: int,
          calls: collections.Counter) -> dict[str, ReachRow]:
    classes = {n or type(model).__name__: type(m).__name__ for n, m in model.named_modules()}
    rows: dict[str, ReachRow] = {}

    def row(cls: str) -> ReachRow:
        return rows.setdefault(cls, ReachRow(cls))

    for name, cls in classes.items():
        row(cls).instances += 1
        row(cls).calls += calls.get(name, 0)
    _count_events(row, classes, report, events, forward_events)
    _count_outside(row, model, report, events, calls)
    return {cls: r for cls, r in rows.items() if r.calls or r.override or r.fallback or r.outside}


def reach(model: nn.Module, *example_inputs: Any, kwargs: dict[str, Any] | None = None, patch: bool = True,
          loss: Callable[[Any], torch.Tensor] | None = None, rules: Iterable[str] | None = None) -> ReachReport:
    """Run one training step of ``model(*example_inputs, **kwargs)`` and report, per module class,
    the calls an override served, those that fell back (and why), and those that computed outside
    the package where a rule could take them. ``patch=True`` patches the model for the step (and
    unpatches it after, unless it was patched before); ``patch=False`` reports the model as it is.
    ``loss(output)`` picks what to differentiate (default: the output's ``loss``, or its mean)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"pn.reach takes an nn.Module, got {type(model).__name__}")
    was_patched = installer.is_patched(model)
    if was_patched:
        report = installer.report_of(model)
    else:
        report = installer.patch(model, rules, dry_run=not patch)
    try:
        events, forward_events, calls = _step(model, example_inputs, dict(kwargs or {}), loss)
    finally:
        if patch and not was_patched:
            installer.unpatch(model)
    key = _device_key(model)
    return ReachReport(type(model).__name__, report, _rows(model, report, events, forward_events, calls),
                       _unserved(events, key), key)
