"""Patch rules: a matcher that recognises a piece of a model, and the replacement that routes it.

A rule answers for one kind of target (``PatchRule.target``):

- ``"module"``: ``matcher(module)`` sees every submodule of the model being patched;
  ``replacement(module, plan)`` returns the forward to install on it (a callable taking the
  module's forward arguments), or a mapping ``{submodule: forward}`` where the rule needs to
  replace more than one forward (the fused loss replaces the output projection's too);
- ``"function"``: ``matcher(function)`` sees every module-level Python function a submodule's
  forward calls by a global name (``apply_rotary_pos_emb``); ``replacement(function, plan)``
  returns the function to call instead, in the patched model's modules only.

``matcher`` returns a *plan* (anything but None: what the replacement needs, worked out once), a
``LeftAlone("why")`` for a target it recognises but will not take, or None for a target it does not
recognise. Matchers run with every DSL held off (references and aten's kernels only), under
``torch.no_grad()``, so they can confirm on a small probe that the replacement computes what the
module computes, bit for bit. Rules registered later are tried first; the first plan wins.

A replacement stands in for the forward, so whatever else the forward does (counting its calls,
logging, keeping state on a module or in a global) would stop: a target whose forward's source shows
such an effect (``effects.writes``) is left alone, unprobed, by every rule unless ``keeps_forward``
(its replacement still runs the target's own forward on every call, as the fused loss does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TARGETS = ("module", "function")


@dataclass(frozen=True)
class LeftAlone:
    """A matcher's answer for a target it recognises but leaves as it is, and why (for the report)."""

    reason: str


@dataclass(frozen=True)
class PatchRule:
    """One rule: ``name`` (shown in reports), ``matcher``, ``replacement`` (see the module's docstring),
    the public names of the ops its replacement calls (``ops``, for the reach report), what it
    applies to (``target``), and whether its replacement still runs the target's own forward on
    every call (``keeps_forward``: targets with side effects are then not refused)."""

    name: str
    matcher: Callable[[Any], Any]
    replacement: Callable[[Any, Any], Callable[..., Any] | Mapping[Any, Callable[..., Any]]]
    ops: tuple[str, ...] = ()
    target: str = "module"
    description: str = ""
    keeps_forward: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"PatchRule name must be an identifier, got {self.name!r}")
        for what in ("matcher", "replacement"):
            if not callable(getattr(self, what)):
                raise TypeError(f"PatchRule {self.name!r}: {what} must be callable, got {getattr(self, what)!r}")
        if self.target not in TARGETS:
            raise ValueError(f"PatchRule {self.name!r}: target={self.target!r}; allowed: {list(TARGETS)}")
        if isinstance(self.ops, str) or not all(isinstance(op, str) for op in self.ops):
            raise TypeError(f"PatchRule {self.name!r}: ops must be a tuple of op names, got {self.ops!r}")


class RuleHandle:
    """What ``register_patch_rule`` returns: ``remove()`` takes the rule out again (models patched
    with it stay patched until ``unpatch``)."""

    def __init__(self, rule: PatchRule):
        self.rule = rule

    def remove(self) -> None:
        with _lock:
            if self.rule in _rules:
                _rules.remove(self.rule)

    def __repr__(self) -> str:
        return f"<patch rule {self.rule.name!r} ({self.rule.target})>"


_lock = threading.Lock()
_rules: list[PatchRule] = []


def register(rule: PatchRule, *, replace: bool = False) -> RuleHandle:
    """Add ``rule`` ahead of those registered before it. A name registered already is refused
    unless ``replace``: then the old rule leaves and the new one takes the front."""
    if not isinstance(rule, PatchRule):
        raise TypeError(f"register_patch_rule takes a PatchRule, got {type(rule).__name__}: {rule!r}")
    with _lock:
        same = [r for r in _rules if r.name == rule.name]
        if same and not replace:
            raise ValueError(f"a patch rule named {rule.name!r} is registered already; pass replace=True to replace it")
        for old in same:
            _rules.remove(old)
        _rules.insert(0, rule)
    return RuleHandle(rule)


def registered(target: str | None = None) -> list[PatchRule]:
    """The rules in the order they are tried (of ``target`` only, when given)."""
    with _lock:
        return [r for r in _rules if target is None or r.target == target]
