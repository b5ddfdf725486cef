"""Model patching: route a built model's hand-written pieces to the package's ops, in place.

``patch(model)`` finds, by structure and a numerical probe, the modules and functions a rule can
take (hand-written RMSNorms, gated MLPs, activations, the rotary application function, the
causal-LM loss, mixture-of-experts routers and experts) and installs replacements that call the
custom ops of ``python_native.ops``, so the overrides of every DSL serve them; ``unpatch(model)``
restores the original forwards and functions exactly. Rules are a registry (``register_patch_rule``) that DSL authors and users
extend; the built-in ones sit in ``op_rules``, a module per custom op beside it. A feature above the custom ops: it imports the ops and the dispatch core, nothing above.
The rules read transformers' modeling files from release 4.56.0 to the newest
(tests/test_transformers_range.py runs both ends).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from torch import nn

from python_native.patching import op_rules
from python_native.patching import rules as _rules
from python_native.patching.installer import is_patched, patch, report_of, unpatch
from python_native.patching.report import PatchEntry, PatchReport
from python_native.patching.rules import LeftAlone, PatchRule, RuleHandle

__all__ = ["LeftAlone", "PatchEntry", "PatchReport", "PatchRule", "RuleHandle", "is_patched", "patch", "patched",
           "patch_rules", "register_patch_rule", "report_of", "unpatch"]

# The built-in rules, one module per custom op in ``op_rules``, found by being there.
op_rules.register_all()


def register_patch_rule(rule: PatchRule, *, replace: bool = False) -> RuleHandle:
    """Add ``rule``; it is tried before every rule registered earlier (the built-in ones included)."""
    return _rules.register(rule, replace=replace)


def patch_rules(target: str | None = None) -> list[PatchRule]:
    """The registered rules in the order they are tried."""
    return _rules.registered(target)


@contextlib.contextmanager
def patched(model: nn.Module, rules: Iterable[str] | None = None) -> Iterator[PatchReport]:
    """``patch(model)`` for the block, then ``unpatch`` (unless the model was patched before the block)."""
    before = is_patched(model)
    report = patch(model, rules)
    try:
        yield report
    finally:
        if not before:
            unpatch(model)
