"""Patch rules on any ``nn.Module`` tree: recognition by structure and probe (no class names), user
rules through ``pn.register_patch_rule``, and the errors that name what was wrong."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

# isort: split
from patch_testing import serving

import python_native as pn


class Norm(nn.Module):
    """A hand-written RMSNorm with an eps of its own name: the weight in fp32, as Olmo2 writes it."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size))
        self.epsilon = 1e-5

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.epsilon)
        return (self.weight * h).to(x.dtype)


class Act(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class FusedMlp(nn.Module):
    def __init__(self, width: int, inner: int):
        super().__init__()
        self.w12 = nn.Linear(width, 2 * inner, bias=False)
        self.w3 = nn.Linear(inner, width, bias=False)

    def forward(self, x):
        up, gate = self.w12(x).chunk(2, dim=-1)  # the up half first
        return self.w3(F.gelu(gate) * up)


class Block(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = Norm(width)
        self.mlp = FusedMlp(width, 48)
        self.act = Act()
        self.fast = FastGelu()

    def forward(self, x):
        return self.fast(self.act(x + self.mlp(self.norm(x))))


class FastGelu(nn.Module):
    """tanh-GELU by another formula: close to gelu_tanh, not bit for bit."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def test_any_module_tree_is_recognised_by_structure_and_probe():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(3, 5, 32)
    with pn.triton.disabled():
        want = block(x)
    with serving(everywhere=True), pn.triton.disabled(), pn.patched(block) as report, pn.trace() as t:
        got = block(x)  # the stand-ins compute the references: bit for bit
    found = {(e.rule, e.target, e.status): e.detail for e in report.entries}
    assert found[("rms_norm", "Norm", "patched")] == "eps=1e-05, offset=0, (offset + weight) in fp32"
    assert found[("gated_mlp", "FusedMlp", "patched")] == "geglu(none); w12.chunk(2) -> (up, gate); w3"
    assert found[("activation", "Act", "patched")] == "quick_gelu"
    assert found[("activation", "FastGelu", "left alone")].startswith("computes gelu_tanh by another formula")
    served = {(e.op, e.module) for e in t.events if e.outcome == "override" and e.dsl == "testdsl"}
    assert served == {("rms_norm", "norm"), ("geglu", "mlp"), ("quick_gelu", "act")}
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_user_rule_goes_before_the_built_in_ones_and_can_be_replaced_and_removed():
    calls = []

    def matcher(module):
        return "mine" if isinstance(module, Norm) else None

    def replacement(module, plan):
        def forward(x):
            calls.append(plan)
            return x
        return forward

    handle = pn.register_patch_rule(pn.PatchRule("my_norm", matcher, replacement, ops=("rms_norm",)))
    try:
        assert pn.patch_rules()[0].name == "my_norm"
        block = Block()
        # The patched forward runs where an override of its custom op serves the input's key (the
        # Triton kernels at the CPU key under the interpreter, else the test DSL's stand-in).
        with serving(), pn.patched(block) as report:
            assert torch.equal(block.norm(torch.ones(2, 32)), torch.ones(2, 32)) and calls == ["mine"]
        assert [e.rule for e in report.entries if e.target == "Norm"] == ["my_norm"]
        with pytest.raises(ValueError, match="'my_norm' is registered already; pass replace=True"):
            pn.register_patch_rule(pn.PatchRule("my_norm", matcher, replacement))
        handle = pn.register_patch_rule(pn.PatchRule("my_norm", lambda m: None, replacement), replace=True)
        assert len([r for r in pn.patch_rules() if r.name == "my_norm"]) == 1
    finally:
        handle.remove()
    assert "my_norm" not in [r.name for r in pn.patch_rules()]


def test_a_matcher_that_raises_leaves_its_targets_alone_and_says_so():
    def broken(module):
        if isinstance(module, Act):
            raise RuntimeError("boom")
        return None

    handle = pn.register_patch_rule(pn.PatchRule("broken", broken, lambda m, p: None))
    try:
        report = pn.patch(Block(), dry_run=True)
        assert {e.target for e in report.patched} == {"Norm", "FusedMlp", "Act"}  # the next rule still took Act
        report = pn.patch(nn.Sequential(Act()), ["broken"], dry_run=True)
    finally:
        handle.remove()
    (entry,) = report.left_alone
    assert entry.detail == "the broken rule's matcher raised RuntimeError: boom"


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="pn.patch takes an nn.Module, got function"):
        pn.patch(lambda x: x)
    with pytest.raises(ValueError, match="no patch rule is named 'nope'; rules: "):
        pn.patch(Block(), ["nope"])
    with pytest.raises(ValueError, match="PatchRule name must be an identifier"):
        pn.PatchRule("my rule", lambda m: None, lambda m, p: None)
    with pytest.raises(ValueError, match="target='class'; allowed: \\['module', 'function'\\]"):
        pn.PatchRule("r", lambda m: None, lambda m, p: None, target="class")
    with pytest.raises(TypeError, match="register_patch_rule takes a PatchRule"):
        pn.register_patch_rule("rms_norm")


def test_a_forward_wrapped_by_other_code_is_left_alone_and_unpatch_keeps_later_wrappers():
    block = Block()
    block.act.forward = lambda x: x  # another library's wrapper, before patching
    report = pn.patch(block)
    assert [e.detail for e in report.left_alone if e.target == "Act"] == [
        "its forward is replaced on the instance already (another library's wrapper)"]
    later = block.norm.forward = lambda x: x  # and one installed over the patch
    pn.unpatch(block)
    assert block.norm.forward is later and "forward" not in block.mlp.__dict__


class NamedNorm(nn.Module):
    """Llama's RMSNorm with its weight under another name (or none)."""

    def __init__(self, size: int, name: str | None):
        super().__init__()
        self.name, self.eps = name, 1e-6
        if name is not None:
            self.register_parameter(name, nn.Parameter(torch.randn(size)))

    def forward(self, x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return h if self.name is None else getattr(self, self.name) * h


@pytest.mark.parametrize("name, detail", [
    ("w", "eps=1e-06, offset=0, weight after the cast back, weight=w"),
    ("scale", "eps=1e-06, offset=0, weight after the cast back, weight=scale"),
    ("gamma", "eps=1e-06, offset=0, weight after the cast back, weight=gamma"),
    (None, "eps=1e-06, no weight"),
])
def test_an_rms_norm_is_recognised_whatever_its_weight_is_called_or_without_one(name, detail):
    norm = nn.Sequential(NamedNorm(32, name))
    x = torch.randn(3, 5, 32)
    with pn.triton.disabled():
        want = norm(x)
    with serving(everywhere=True), pn.triton.disabled(), pn.patched(norm) as report, pn.trace() as t:
        got = norm(x)
        if name is not None:
            got.sum().backward()
    assert [(e.rule, e.status, e.detail) for e in report.entries] == [("rms_norm", "patched", detail)]
    assert [(e.op, e.outcome, e.module) for e in t.events if e.op == "rms_norm"] == [("rms_norm", "override", "0")]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if name is not None:
        assert getattr(norm[0], name).grad is not None


def test_a_weightless_module_without_an_eps_is_not_probed_as_a_norm():
    class Scale(nn.Module):
        def forward(self, x):
            return x * 2

    assert pn.patch(nn.Sequential(Scale()), dry_run=True).entries == []


class OwnDtypeNorm(nn.Module):
    """An RMSNorm computed in the input's own dtype: Llama's bits in fp32 only."""

    def __init__(self, size: int):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.randn(size)), 1e-6

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def test_the_report_names_the_input_dtypes_a_norm_is_routed_for_and_a_call_in_another_runs_the_module():
    norm = nn.Sequential(OwnDtypeNorm(32))
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    with pn.triton.disabled():
        want = norm.to(torch.bfloat16)(x)
    with serving(everywhere=True), pn.triton.disabled(), pn.patched(norm) as report, pn.trace() as t:
        got = norm(x)
    assert [(e.status, e.detail) for e in report.entries] == [
        ("patched", "eps=1e-06, offset=0, weight after the cast back; float32 inputs only")]
    (event,) = [e for e in t.events if e.op == "rms_norm"]
    assert event.outcome == "fallback" and event.reason == (
        "patch: input torch.bfloat16 (3, 5, 32): a dtype the probe did not confirm: the module's own forward ran")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
