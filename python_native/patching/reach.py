"""``pn.reach(model, *inputs)``: one training step, and per module class what ran where.

It patches the model for the step (unless told not to, or patched already), attributes every
routed call to the innermost module it ran in (forward hooks set the module scope of the modules
no rule patched; patched ones set their own; the declared ops' backwards keep their forward's),
runs a forward and a backward under ``pn.trace()``, and tables per module class:

- ``override``: routed calls an override served;
- ``fallback``: routed calls that ran aten's kernel or a declared op's reference, each reason listed;
- ``outside``: calls of modules (or of the functions they call) that a rule recognises but that
  computed outside the package: left alone (with the reason), or not patched for this step.

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
from python_native.foundations import declared, module_scope, public_names
from python_native.patching import installer, reach_table
from python_native.patching.report import PatchReport

BACKWARD = "(backward, no module)"
OUTSIDE_MODULES = "(outside any module)"


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
    unserved: list[str]  # declared ops the patch routes to that have no override at the step's key
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
    """The declared ops the step called with no override installed at ``key`` (forwards seen in the
    trace, and the backwards declared with them)."""
    called = {e.op for e in events if (e.reason or "").startswith(f"no override of {declared.NAMESPACE}::")}
    mine = {d.name for d in declared.declared()}
    ops = {op for name in called for op in (name, *public_names.covered(name.partition(".")[0]))} & mine
    return sorted(op for op in ops if not getattr(REGISTRY.slots.get((declared.NAMESPACE, op, key)), "overrides", None))


def _rows(model: nn.Module, report: PatchReport, events: list, forward_events: int,
          calls: collections.Counter) -> dict[str, ReachRow]:
    classes = {n or type(model).__name__: type(m).__name__ for n, m in model.named_modules()}
    rows: dict[str, ReachRow] = {}

    def row(cls: str) -> ReachRow:
        return rows.setdefault(cls, ReachRow(cls))

    for name, cls in classes.items():
        row(cls).instances += 1
        row(cls).calls += calls.get(name, 0)
    for i, e in enumerate(events):
        cls = classes.get(e.module, BACKWARD if i >= forward_events else OUTSIDE_MODULES)
        if e.outcome == "override":
            row(cls).override[e.op] += 1
        else:
            row(cls).fallback[(e.op, e.reason or "-")] += 1
    for entry in report.entries:
        if entry.status == "patched":
            continue
        why = entry.detail if entry.status == "left alone" else "not patched for this step (pn.patch would route it)"
        for name in entry.modules:
            cls = classes.get(name)
            if cls is not None and calls.get(name):
                label = entry.rule if entry.kind == "module" else f"{entry.rule} ({entry.target.rpartition('.')[2]})"
                row(cls).outside[(label, why)] += calls[name]
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
