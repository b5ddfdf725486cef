"""The rules' decisions over a model's modules and the functions their forwards call.

``match`` walks ``model.named_modules()``: each module goes to the module rules in order (the first
plan wins; a ``LeftAlone`` is reported when no rule takes it), modules of equal structure share one
probe, and the modules no module rule took show their forward's global names to the function rules
(each function matched once). A target whose forward writes state (``effects.writes``) is refused
by every rule that would drop that. Kept apart from ``installer``, which installs and undoes what
is decided here, so that deciding can be read (and changed) without the installing machinery.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterable
from typing import Any

from torch import nn

from python_native.patching import effects, probe, runtime
from python_native.patching.report import PatchReport
from python_native.patching.rules import LeftAlone, PatchRule


def _cache_key(module: nn.Module) -> tuple:
    """What a module rule's answer can depend on: class, own parameters and buffers (shape, dtype,
    device), children's classes and parameters, plain attributes. Equal keys share one probe."""

    def tensors(m: nn.Module) -> tuple:
        return tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in [*m._parameters.items(), *m._buffers.items()]
                     if t is not None)

    plain = tuple(sorted((k, v) for k, v in vars(module).items()
                         if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None)))))
    children = tuple((n, type(c), tensors(c)) for n, c in module.named_children())
    return type(module), tensors(module), children, plain


def _ask(rule: PatchRule, target: Any, effect: str | None = None) -> Any:
    """The matcher's answer; a matcher that raises leaves the target alone, saying so. Where the
    target has a side ``effect`` that the rule's replacement would drop, no probe runs it, and a
    plan is turned into a ``LeftAlone`` naming the effect."""
    refused = None if rule.keeps_forward else effect
    try:
        with probe.refusing(refused):
            answer = rule.matcher(target)
    except probe.Refused as e:
        return LeftAlone(_unprobed(e.reason))
    except Exception as e:  # one bad rule must not stop the others
        return LeftAlone(f"the {rule.name} rule's matcher raised {type(e).__name__}: {e}")
    if refused is not None and answer is not None and not isinstance(answer, LeftAlone):
        return LeftAlone(_unprobed(refused))
    return answer


def _unprobed(effect: str) -> str:
    return f"{effect}: a replacement would drop that, so it was neither probed nor routed"


def _decide(module: nn.Module, rules: list[PatchRule], cache: dict) -> tuple[PatchRule | None, Any]:
    """(rule, plan) for the first rule that takes ``module``; (rule, LeftAlone) or (None, None) otherwise."""
    key = None
    try:
        key = _cache_key(module)
        if key in cache:
            return cache[key]
    except TypeError:  # an unhashable attribute: no sharing
        pass
    answer: tuple[PatchRule | None, Any] = (None, None)
    effect = effects.writes(type(module).forward, owner=type(module))
    for rule in rules:
        result = _ask(rule, module, effect)
        if result is None:
            continue
        if not isinstance(result, LeftAlone):
            answer = (rule, result)
            break
        if answer[0] is None:
            answer = (rule, result)
    if key is not None:
        cache[key] = answer
    return answer


def _describe(plan: Any) -> str:
    describe = getattr(plan, "describe", None)
    return describe() if callable(describe) else type(plan).__name__


def display_name(name: str, model: nn.Module) -> str:
    return name or type(model).__name__


def _called_functions(module: nn.Module) -> Iterable[tuple[dict, str, types.FunctionType]]:
    """(globals, name, function) for each module-level Python function the class's forward calls by name."""
    forward = inspect.unwrap(type(module).forward)
    code, namespace = getattr(forward, "__code__", None), getattr(forward, "__globals__", None)
    if code is None or namespace is None:
        return
    for name in code.co_names:
        value = namespace.get(name)
        value = getattr(value, "__python_native_original__", value)  # patched by another model already
        if isinstance(value, types.FunctionType) and not (value.__module__ or "").startswith("torch"):
            yield namespace, name, value


def match(model: nn.Module, rules: list[PatchRule], report: PatchReport, status: str) -> tuple[list, list]:
    """The decisions: (name, module, rule, plan) for modules, (globals, name, function, rule, plan, callers)."""
    module_rules = [r for r in rules if r.target == "module"]
    function_rules = [r for r in rules if r.target == "function"]
    taken, cache, function_answers, calls = [], {}, {}, {}
    for name, module in model.named_modules():
        if getattr(module.__dict__.get("forward"), runtime.MARK, None) is not None:
            continue  # patched already (a shared module, or a submodule patched on its own)
        display = display_name(name, model)
        rule, plan = _decide(module, module_rules, cache) if module_rules else (None, None)
        if rule is not None and not isinstance(plan, LeftAlone):
            if "forward" in module.__dict__:
                plan = LeftAlone("its forward is replaced on the instance already (another library's wrapper)")
            else:
                taken.append((display, module, rule, plan))
                report.add(rule.name, type(module).__name__, "module", status, _describe(plan), display, rule.ops,
                           runtime.rule_ops(rule.ops, plan))
                continue
        if isinstance(plan, LeftAlone):
            report.add(rule.name, type(module).__name__, "module", "left alone", plan.reason, display, rule.ops)
        if "forward" in module.__dict__:
            continue
        for namespace, fname, function in _called_functions(module):
            if function not in function_answers:
                effect = effects.writes(function, "the function")
                function_answers[function] = next(
                    ((r, a) for r in function_rules if (a := _ask(r, function, effect)) is not None), (None, None))
            frule, fplan = function_answers[function]
            if frule is None:
                continue
            target = f"{function.__module__}.{function.__qualname__}"
            verdict = ("left alone", fplan.reason) if isinstance(fplan, LeftAlone) else (status, _describe(fplan))
            ops = () if isinstance(fplan, LeftAlone) else runtime.rule_ops(frule.ops, fplan)
            report.add(frule.name, target, "function", verdict[0], verdict[1], display, frule.ops, ops)
            if not isinstance(fplan, LeftAlone):
                calls.setdefault((id(namespace), fname), [namespace, fname, function, frule, fplan, []])[5].append(
                    (display, module))
    return taken, list(calls.values())
