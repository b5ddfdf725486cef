"""``pn.patch`` on the MoE families beyond those of ``test_moe.py``: GraniteMoE (plain, with a shared
expert, hybrid with Mamba), Qwen2-MoE (shared expert and its gate), Jamba, PhiMoE, Laguna and the other
families whose experts are stacked; Llama 4's experts and router, which the ops cannot reproduce,
are left to the modules with the reason. Every routed router and experts call reaches an override
(forward and backward, from the trace), one training step gives the unpatched loss and gradients
(fp32, 1e-5 relative), ``unpatch`` restores the model exactly, and ``pn.reach`` shows what ran where."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import aten_overrides_off, step
from test_moe import MOE_RULES, assert_near, assert_unpatch_restores_exactly, moe_serving

import python_native as pn
from python_native.patching.op_rules import moe_experts as moe
from python_native.tools import tiny_models

# family -> tiny-config overrides (experts 32 wide: the interpreter runs their kernels' tiles one by one);
# K=3 with Qwen2-MoE and GraniteMoE-shared, where the two ways of summing a token's experts part
FAMILIES = {"granitemoe": {"num_experts_per_tok": 2, "intermediate_size": 32},
            "granitemoeshared": {"num_experts_per_tok": 3, "intermediate_size": 32, "shared_intermediate_size": 32},
            "granitemoehybrid": {"num_experts_per_tok": 2, "intermediate_size": 32, "shared_intermediate_size": 32},
            "qwen2_moe": {"num_experts_per_tok": 3, "norm_topk_prob": True},
            "jamba": {"num_experts_per_tok": 2, "intermediate_size": 32},
            "phimoe": {"num_experts_per_tok": 2, "intermediate_size": 32},
            "laguna": {"num_experts_per_tok": 2}}  # its sigmoid router's correction bias a frozen parameter
ROUTER_LEFT_ALONE = {"phimoe"}  # its sparsemixer router jitters its input in place and samples its experts
# more families whose experts and routers the rules take as they are (a dry run: no step)
ALSO_TAKEN = ["cohere2_moe", "flex_olmo", "minimax", "qwen3_next", "granitemoe_swa", "glm4_moe", "deepseek_v2",
              "bailing_hybrid", "exaone_moe", "kimi_linear", "mimo_v2_flash", "solar_open"]


def tiny(family: str, **overrides) -> torch.nn.Module:
    return tiny_models.build(family, **{**FAMILIES[family], **overrides}).train()


def moe_modules(m: torch.nn.Module) -> tuple[list[str], list[str]]:
    """(experts, routers) by name: the modules holding stacked ``gate_up_proj`` weights, and their
    siblings that score them (a 2-D weight with a row per expert)."""
    named = dict(m.named_modules())
    experts = [n for n, mod in named.items() if isinstance(mod._parameters.get("gate_up_proj"), torch.Tensor)]
    routers = []
    for name in experts:
        parent, _, _ = name.rpartition(".")
        count = named[name].gate_up_proj.shape[0]
        routers += [f"{parent}.{c}" for c, child in named[parent].named_children()
                    if c != name.rpartition(".")[2] and getattr(child, "weight", None) is not None
                    and child.weight.dim() == 2 and child.weight.shape[0] == count]
    return experts, routers


def seeded_step(m: torch.nn.Module, batch: dict) -> tuple:
    torch.manual_seed(0)  # PhiMoE's router samples its experts in training: both steps draw alike
    return step(m, batch)


@pytest.mark.slow  # a training step of each model, its MoE kernels under the interpreter
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_router_and_experts_call_is_served_and_the_step_is_the_unpatched_one(family):
    m = tiny(family)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    experts, routers = moe_modules(m)
    assert experts and len(routers) == len(experts), (experts, routers)
    with moe_serving(), aten_overrides_off():
        loss, grads = seeded_step(m, batch)
        with pn.patched(m, MOE_RULES) as report, pn.trace() as t:
            patched_loss, patched_grads = seeded_step(m, batch)
    taken = {name for e in report.patched for name in e.modules}
    served_routers = [] if family in ROUTER_LEFT_ALONE else routers
    assert taken == {*experts, *served_routers}, report
    served = [(e.op, e.module) for e in t.events if e.op.startswith("moe_") and e.outcome == "override"]
    for ops, names in ((("moe_experts", "moe_experts_backward"), experts),
                       (("moe_route", "moe_route_backward"), served_routers)):
        for op in ops:
            assert sorted(module for o, module in served if o == op) == sorted(names), (op, served)
    assert not [e for e in t.events if e.op.startswith("moe_") and e.outcome != "override"]
    assert abs(patched_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())
    assert patched_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert_near(patched_grads[name], grad, msg=name)


@pytest.mark.slow  # three training steps, the patched one's MoE kernels under the interpreter
@pytest.mark.parametrize("family", ["granitemoeshared", "qwen2_moe", "jamba"])
def test_unpatch_restores_the_family_exactly(family):
    assert_unpatch_restores_exactly(tiny(family))


def _moe_fallbacks(row) -> list:
    return [op for op, _ in row.fallback if op.startswith("moe_")]


def _outside(report) -> dict:
    return {(row.module_class, why): n for row in report.rows.values() for (_, why), n in row.outside.items()}


@pytest.mark.slow  # two reach steps under the interpreter
@pytest.mark.parametrize("family", ["qwen2_moe", "phimoe"])
def test_reach_shows_the_experts_and_routers_served_or_the_router_outside_with_its_reason(family):
    m = tiny(family)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    experts, routers = moe_modules(m)
    named = dict(m.named_modules())
    experts_class, router_class = type(named[experts[0]]).__name__, type(named[routers[0]]).__name__
    torch.manual_seed(0)
    with moe_serving(), aten_overrides_off():
        report = pn.reach(m, kwargs=batch, rules=MOE_RULES)
    assert report.rows[experts_class].override == {"moe_experts": len(experts), "moe_experts_backward": len(experts)}
    assert not report.rows[experts_class].outside and not _moe_fallbacks(report.rows[experts_class])
    router = report.rows[router_class]
    if family in ROUTER_LEFT_ALONE:
        assert not router.override
        ((why, calls),) = [(w, n) for (c, w), n in _outside(report).items() if c == router_class]
        assert calls == len(routers) and "augments hidden_states in place" in why, why
        assert f"{router_class}: moe_router x{len(routers)}: its forward augments hidden_states" in str(report)
    else:
        assert router.override == {"moe_route": len(routers), "moe_route_backward": len(routers)}
        assert not router.outside and not _moe_fallbacks(router)


def test_llama4s_experts_and_router_are_left_to_the_modules_saying_why():
    """Its experts run every token with the routing scores on their inputs, and its router returns
    dense scores: neither is what the ops compute, so both stay with their own code."""
    m = tiny_models.build("llama4_text", num_experts_per_tok=1).train()
    report = pn.patch(m, MOE_RULES, dry_run=True)
    found = {e.target: (e.status, e.detail) for e in report.entries}
    assert found["Llama4TextExperts"] == ("left alone", moe.DENSE_EXPERTS)
    status, why = found["Llama4Router"]
    assert status == "left alone" and "returns 2 tensors of shapes (16, 4), (16, 4), neither (logits, weights, indices)" in why
    with aten_overrides_off():
        reached = pn.reach(m, kwargs=tiny_models.example_inputs(m, batch=2, seq=8), rules=MOE_RULES)
    outside = _outside(reached)
    assert outside[("Llama4TextExperts", moe.DENSE_EXPERTS)] == 2
    assert outside[("Llama4Router", why)] == 2


class _SamplingRouter(torch.nn.Module):
    """A router that samples its experts (as PhiMoE's does in training), with no in-place write."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 16))
        self.top_k = 2

    def forward(self, hidden_states):
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        noisy = logits - torch.empty_like(logits).exponential_().log()
        indices = noisy.topk(self.top_k, dim=-1).indices
        return logits, logits.softmax(-1).gather(1, indices), indices


def test_a_router_that_samples_its_experts_is_left_alone_saying_so():
    (entry,) = pn.patch(_SamplingRouter(), ["moe_router"], dry_run=True).entries
    assert entry.status == "left alone" and "draws random numbers" in entry.detail and "training" in entry.detail


@pytest.mark.parametrize("family", ALSO_TAKEN)
def test_the_rules_take_the_other_families_stacked_experts_and_routers(family):
    m = tiny_models.build(family).train()
    experts, routers = moe_modules(m)
    report = pn.patch(m, MOE_RULES, dry_run=True)
    taken = {name for e in report.entries if e.status == "would patch" for name in e.modules}
    assert experts and set(experts) <= taken, report
    assert set(routers) <= taken, report


# transformers before 5.0 gave GPT-OSS's experts dense (tokens, experts) routing weights by keyword, and
# its router returned (those weights, indices): the rules take that layout too. Run where that release is
# first on the path (``test_transformers_range`` installs it), so the installed one is never touched.
OLD_GPT_OSS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch, transformers
import python_native as pn
from patch_testing import aten_overrides_off, step
from test_moe import MOE_RULES, moe_serving
from python_native.tools import tiny_models

m = tiny_models.build("gpt_oss", num_experts_per_tok=2, intermediate_size=32).train()
batch = tiny_models.example_inputs(m, batch=2, seq=8)
with moe_serving(), aten_overrides_off():
    loss, grads = step(m, batch)
    with pn.patched(m, MOE_RULES) as report, pn.trace() as t:
        patched_loss, patched_grads = step(m, batch)
    again, again_grads = step(m, batch)
worst = max(float((patched_grads[n] - g).abs().max() / g.abs().max().clamp(min=1e-30)) for n, g in grads.items())
print(json.dumps({
    "transformers": transformers.__version__,
    "patched": sorted([e.rule, e.target, e.detail] for e in report.patched),
    "served": sorted([e.op, e.module] for e in t.events if e.op.startswith("moe_") and e.outcome == "override"),
    "not_served": len([e for e in t.events if e.op.startswith("moe_") and e.outcome != "override"]),
    "loss": [loss.item(), patched_loss.item()], "worst_grad": worst, "same_grads": patched_grads.keys() == grads.keys(),
    "unpatched_exact": bool(torch.equal(again, loss)) and all(torch.equal(again_grads[n], g) for n, g in grads.items()),
}))
"""


@pytest.mark.slow  # installs transformers 4.56.0 into a temporary folder, then a training step in a subprocess
def test_gpt_oss_before_5_0_routes_its_dense_layout_and_trains_as_unpatched(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_transformers_range import OLDEST, _install_oldest

    folder = tmp_path / "site"
    _install_oldest(folder)
    tests, root = Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(folder), str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", OLD_GPT_OSS, str(tests)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["transformers"] == OLDEST
    details = {target: detail for _, target, detail in result["patched"]}
    assert details["GptOssTopKRouter"].endswith("returns dense weights and indices"), details
    assert details["GptOssExperts"].endswith("dense routing weights"), details
    layers = 2
    for op, module in (("moe_route", "router"), ("moe_route_backward", "router"), ("moe_experts", "experts"),
                       ("moe_experts_backward", "experts")):
        names = [f"model.layers.{i}.mlp.{module}" for i in range(layers)]
        assert sorted(m for o, m in result["served"] if o == op) == names, (op, result["served"])
    assert result["not_served"] == 0
    loss, patched_loss = result["loss"]
    assert abs(patched_loss - loss) <= 1e-5 * abs(loss) and result["same_grads"] and result["worst_grad"] <= 1e-5
    assert result["unpatched_exact"]


@pytest.mark.parametrize("family", ["laguna", "gpt_oss"])
def test_a_frozen_models_routers_are_taken_as_a_trainable_ones(family):
    """Freezing the model (as adapters do) makes every parameter one that takes no gradient: only a
    per-expert vector besides ``weight`` and ``bias`` is read as a correction bias."""
    m = tiny_models.build(family).train()
    want = {e.target: e.detail for e in pn.patch(m, ["moe_router"], dry_run=True).patched}
    m.requires_grad_(False)
    got = {e.target: e.detail for e in pn.patch(m, ["moe_router"], dry_run=True).patched}
    assert got == want and len(want) == 1, (got, want)


@pytest.mark.parametrize("family", ["granitemoe", "laguna"])
def test_bf16_routers_that_make_their_logits_fp32_are_served_bit_for_bit(family):
    """GraniteMoE's and Laguna's routers run the linear layer in bf16, route on its fp32 copy and cast
    the weights back: with the references serving, the patched model's outputs are the unpatched ones."""
    m = tiny(family).to(torch.bfloat16)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    with pn.triton.disabled(), moe_serving(everywhere=True), aten_overrides_off():
        out = m(**batch)
        with pn.patched(m, MOE_RULES) as report, pn.trace() as t:
            same = m(**batch)
    assert "logits made fp32 after the linear layer" in {e.rule: e.detail for e in report.patched}["moe_router"]
    _, routers = moe_modules(m)
    served = sorted(e.module for e in t.events if e.op == "moe_route" and e.outcome == "override")
    assert served == sorted(routers), served
    assert torch.equal(same.logits, out.logits) and torch.equal(same.loss, out.loss)
