"""The built-in patch rules are modules of ``python_native.patching.op_rules``, one per custom op,
found by being there: no list names them, each declares its place in the try-order, and one that is
broken disables only itself and is named in ``pn.status()``'s problems."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

# isort: split
from patch_testing import serving

import python_native as pn
from python_native.foundations import faults
from python_native.patching import op_rules, rules

PACKAGE = op_rules.__name__
# The try-order of the built-in rules, as each module's PRIORITY places it.
BUILT_IN = ["rms_norm", "layer_norm", "moe_router", "moe_experts", "gated_mlp", "activation", "causal_lm_loss",
            "rotary"]

DROPPED = textwrap.dedent('''
    """A rule dropped into the package: QuickGelu modules to quick_gelu, ahead of the activation rule."""
    from python_native.ops import activation_op
    from python_native.patching import runtime
    from python_native.patching.rules import PatchRule

    PRIORITY = 35  # between gated (40) and activation (30)


    def match(module):
        return "by name" if type(module).__name__ == "QuickGelu" else None


    def replace(module, plan):
        def forward(x):
            runtime.routing("quick_gelu", x)
            return activation_op.QUICK_GELU(x)
        return forward


    RULES = [PatchRule("zz_quick_gelu", match, replace, ops=("quick_gelu",))]
''')
BROKEN = {
    "zz_broken_import": ("raise ImportError('a missing dependency')\n", "ImportError: a missing dependency"),
    "zz_bad_priority": ("PRIORITY = 'first'\nRULES = []\n", "PRIORITY must be an int"),
    "zz_bad_rules": ("PRIORITY = 1\nRULES = ['rms_norm']\n", "RULES must be a list of PatchRule"),
    "zz_taken_name": ("from python_native.patching.op_rules.rms_norm import RULES as _theirs\nPRIORITY = 99\n"
                      "RULES = list(_theirs)\n", "'rms_norm' is registered already"),
}


class QuickGelu(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


def test_the_built_in_rules_are_the_modules_of_the_package_in_their_declared_order():
    assert [r.name for r in pn.patch_rules()][-len(BUILT_IN):] == BUILT_IN
    modules = op_rules.discover(PACKAGE, broken := {})
    assert broken == {}
    assert [m.PRIORITY for m in modules] == sorted(m.PRIORITY for m in modules)
    assert {r.name for m in modules for r in m.RULES} == set(BUILT_IN)


@pytest.fixture
def dropped(tmp_path, monkeypatch):
    """A copy of the package's path with a rule module, a helper and broken modules dropped in, over
    an empty registry (the real one comes back after the test)."""
    (tmp_path / "zz_quick_gelu.py").write_text(DROPPED)
    (tmp_path / "zz_helper.py").write_text("VALUE = 1  # no RULES: a helper, not a rule module\n")
    for name, (source, _) in BROKEN.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.setattr(op_rules, "__path__", [*op_rules.__path__, str(tmp_path)])
    monkeypatch.setattr(rules, "_rules", [])
    names = ["zz_quick_gelu", "zz_helper", *BROKEN]
    yield
    for name in names:
        sys.modules.pop(f"{PACKAGE}.{name}", None)
        faults.resolve(f"patch rules {PACKAGE}.{name}")


def test_a_dropped_rule_module_is_found_and_used_and_a_broken_one_disables_only_itself(dropped):
    with pytest.warns(UserWarning, match="its rules are left out"):
        registered = op_rules.register_all()
    assert f"{PACKAGE}.zz_quick_gelu" in registered and f"{PACKAGE}.zz_helper" not in registered
    assert [r.name for r in pn.patch_rules()] == [*BUILT_IN[:5], "zz_quick_gelu", *BUILT_IN[5:]]
    problems = {p["source"]: p["problem"] for p in pn.status()["problems"]}
    for name, (_, why) in BROKEN.items():
        assert why in problems[f"patch rules {PACKAGE}.{name}"], problems
    assert not any("zz_helper" in source for source in problems)

    model = nn.Sequential(nn.Linear(8, 8), QuickGelu())
    x = torch.randn(2, 8)
    want = model(x)
    with serving(), pn.patched(model) as report, pn.trace() as t:
        got = model(x)
    assert [(e.rule, e.target, e.status) for e in report.entries] == [("zz_quick_gelu", "QuickGelu", "patched")]
    assert [(e.op, e.module) for e in t.events if e.outcome == "override"] == [("quick_gelu", "1")]
    torch.testing.assert_close(got, want)
