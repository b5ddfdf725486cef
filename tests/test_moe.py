"""Mixture-of-experts: ``python_native::moe_route`` and ``moe_experts`` against transformers' own
routers and experts (Mixtral, Qwen3-MoE, OLMoE, GPT-OSS, DeepSeek-V3), bit for bit forward and
within fp32 rounding backward; and ``pn.patch`` on tiny MoE models: every router and experts call
reaches an override, loss and gradients match the unpatched model, ``unpatch`` restores it exactly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import aten_overrides_off, serving, step

import python_native as pn
from conftest import TEST_DSL, always
from python_native.core.registry import REGISTRY
from python_native.ops import moe_experts_op, moe_route_op
from python_native.tools import tiny_models

MOE_OPS = {"moe_route": (moe_route_op._reference, moe_route_op._reference_backward),
           "moe_experts": (moe_experts_op._reference, moe_experts_op._reference_backward)}
MOE_RULES = ["moe_router", "moe_experts"]  # the other rules' ops have tests of their own
# family -> tiny-config overrides: K=3 (the two ways of summing part), K=2, and K=E (GPT-OSS's 4 of 4)
# (experts 32 wide: the interpreter runs their kernels' tiles one by one)
FAMILIES = {"mixtral": {"num_experts_per_tok": 2, "intermediate_size": 32},
            "qwen3_moe": {"num_experts_per_tok": 3, "norm_topk_prob": True},
            "olmoe": {"num_experts_per_tok": 2, "intermediate_size": 32},
            "gpt_oss": {"num_experts_per_tok": 4, "intermediate_size": 32}}


@contextlib.contextmanager
def moe_serving(everywhere: bool = False) -> Iterator[None]:
    """Stand-in overrides of the MoE ops at the CPU key where no backend serves them (``everywhere``:
    behind any backend's, for tests that switch the backends off), plus the stand-ins of the other
    custom ops: a patched model's calls then reach an override whatever is installed."""
    handles = []
    try:
        for public, (forward, backward) in MOE_OPS.items():
            for op, impl, is_backward in ((public, forward, False), (f"{public}_backward", backward, True)):
                slot = REGISTRY.slots.get(("python_native", op, "CPU"))
                if everywhere or slot is None or not any(o.dsl != TEST_DSL for o in slot.overrides):
                    handles.append(pn.register_op_override(TEST_DSL, "python_native", op, "CPU", always, impl,
                                                           public_name=public, backward=is_backward))
        with serving(everywhere):
            yield
    finally:
        for handle in handles:
            handle.remove()


@pytest.fixture
def references() -> Iterator[None]:
    """Every backend off: the ops run their references, which must be the modules' results bit for bit."""
    with pn.triton.disabled(), getattr(pn, TEST_DSL).disabled():
        yield


def tiny(family: str, dtype: torch.dtype = torch.float32, **overrides) -> torch.nn.Module:
    return tiny_models.build(family, dtype=dtype, **{**FAMILIES[family], **overrides}).train()


def layer_of(m: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(router, experts) of the first MoE layer."""
    mlp = m.model.layers[0].mlp
    return getattr(mlp, "gate", None) or mlp.router, mlp.experts


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.3)
    return module


def assert_near(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """fp32 agreement to 1e-5 of the tensor's scale (GEMMs of other shapes sum in other orders)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()), msg=msg or None)


def _experts_args(experts: torch.nn.Module, family: str) -> dict:
    gpt = family == "gpt_oss"
    return dict(gate_up_bias=getattr(experts, "gate_up_proj_bias", None), down_bias=getattr(experts, "down_proj_bias", None),
                activation="clamped_swiglu" if gpt else "silu", transposed=gpt, interleaved=gpt)


def _route_args(family: str) -> dict:
    return {"mixtral": dict(renormalize=True, keep_float=True), "qwen3_moe": dict(renormalize=True),
            "olmoe": dict(), "gpt_oss": dict(topk_first=True)}[family]


# -- the ops against the modules ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_route_is_the_routers_forward_bit_for_bit(family, dtype, references):
    router, _ = layer_of(tiny(family, dtype))
    randomised(router, 1)
    x = torch.randn(11, 64).to(dtype)
    logits, weights, indices = router(x)
    got = moe_route_op.moe_route(logits, router.top_k, **_route_args(family))
    assert got[0].dtype == weights.dtype and torch.equal(got[0], weights) and torch.equal(got[1], indices)


def test_route_is_deepseek_v3s_group_limited_sigmoid_router_bit_for_bit(references):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = DeepseekV3Config(hidden_size=64, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
                           routed_scaling_factor=2.5, norm_topk_prob=True)
    router = randomised(DeepseekV3TopkRouter(cfg), 2)
    router.e_score_correction_bias.copy_(torch.randn(8) * 0.1)
    x = torch.randn(9, 64, requires_grad=True)
    logits, weights, indices = router(x)
    got_w, got_i = moe_route_op.moe_route(logits.detach(), 3, "sigmoid", renormalize=True, renormalize_eps=1e-20,
                                          bias=router.e_score_correction_bias, n_group=4, topk_group=2, scaling=2.5)
    assert torch.equal(got_w, weights) and torch.equal(got_i, indices)
    # the backward: the logits' gradient autograd takes through the module's own steps
    g = torch.randn_like(weights)
    want = torch.autograd.grad(weights, logits, g)[0]
    leaf = logits.detach().requires_grad_()
    w, _ = moe_route_op.moe_route(leaf, 3, "sigmoid", renormalize=True, renormalize_eps=1e-20,
                                  bias=router.e_score_correction_bias, n_group=4, topk_group=2, scaling=2.5)
    torch.testing.assert_close(torch.autograd.grad(w, leaf, g)[0], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_route_gradient_is_autograds_through_the_router(family, references):
    router, _ = layer_of(tiny(family))
    randomised(router, 3)
    x = torch.randn(10, 64)
    logits, weights, _ = router(x)
    g = torch.randn_like(weights)
    want = torch.autograd.grad(weights, logits, g)[0]
    leaf = logits.detach().requires_grad_()
    w, _ = moe_route_op.moe_route(leaf, router.top_k, **_route_args(family))
    torch.testing.assert_close(torch.autograd.grad(w, leaf, g)[0], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_experts_are_the_modules_forward_bit_for_bit(family, dtype, implementation, references):
    m = tiny(family, dtype)
    m.config._experts_implementation = implementation
    router, experts = layer_of(m)
    randomised(router, 4)
    x = torch.randn(13, 64).to(dtype)
    _, weights, indices = router(x)
    want = experts(x, indices, weights)
    combine = "index_add" if implementation == "eager" else "sum"
    got = moe_experts_op.moe_experts(x, indices, weights, experts.gate_up_proj, experts.down_proj, combine=combine,
                                     **_experts_args(experts, family))
    assert got.dtype == want.dtype and torch.equal(got, want)


def _module_grads(experts, x, indices, weights, g) -> tuple:
    params = [p for _, p in experts.named_parameters()]
    return torch.autograd.grad(experts(x, indices, weights), [x, weights, *params], g)


def _op_grads(experts, family, x, indices, weights, g) -> tuple:
    params = [p for _, p in experts.named_parameters()]
    out = moe_experts_op.moe_experts(x, indices, weights, experts.gate_up_proj, experts.down_proj,
                                     **_experts_args(experts, family))
    return torch.autograd.grad(out, [x, weights, *params], g)


def _indices(case: str, tokens: int, top_k: int, experts: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    if case == "all to one":  # every token's first choice is expert 1
        rest = [torch.tensor([e for e in range(experts) if e != 1])[torch.randperm(experts - 1, generator=g)][: top_k - 1]
                for _ in range(tokens)]
        return torch.stack([torch.cat([torch.tensor([1]), r]) for r in rest])
    pool = experts if case == "top_k = E" else experts - 1  # "idle expert": the last gets no token
    return torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(tokens)])


@pytest.mark.parametrize("case", ["idle expert", "top_k = E", "all to one"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_experts_gradients_match_autograd_through_the_module(family, case, references):
    m = tiny(family)
    m.config._experts_implementation = "eager"
    _, experts = layer_of(m)
    randomised(experts, 6)
    e = experts.gate_up_proj.shape[0]
    top_k = {"idle expert": 2, "top_k = E": e, "all to one": 1 if family == "mixtral" else 3}[case]
    indices = _indices(case, 9, top_k, e)
    weights = torch.rand(9, top_k, requires_grad=True)
    x = torch.randn(9, 64, requires_grad=True)
    g = torch.randn(9, 64)
    want = experts(x, indices, weights)
    got = moe_experts_op.moe_experts(x, indices, weights, experts.gate_up_proj, experts.down_proj,
                                     combine="index_add", **_experts_args(experts, family))
    assert torch.equal(got, want)
    for a, b in zip(_op_grads(experts, family, x, indices, weights, g), _module_grads(experts, x, indices, weights, g),
                    strict=True):
        assert_near(a, b)
    if case == "idle expert":  # an expert given no token gets zero gradients
        grad_gate_up = _op_grads(experts, family, x, indices, weights, g)[2]
        assert not grad_gate_up[e - 1].any()


def test_bad_arguments_are_named_with_what_is_allowed():
    w = torch.randn(4, 8, 16)
    with pytest.raises(ValueError, match="activation='relu'.*allowed"):
        moe_experts_op.moe_experts(torch.randn(3, 16), torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2),
                                   torch.randn(4, 8, 16), torch.randn(4, 16, 4), activation="relu")
    with pytest.raises(ValueError, match=r"must be \(4, 32, 16\) and \(4, 16, 16\).*got \(4, 8, 16\) and \(4, 4, 16\)"):
        moe_experts_op.moe_experts(torch.randn(3, 16), torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2),
                                   w, torch.randn(4, 16, 5)[:, :, :4].transpose(1, 2))
    with pytest.raises(ValueError, match=r"expert indices must lie in \[0, 4\), got values from 0 to 4"):
        moe_experts_op.moe_experts(torch.randn(3, 16), torch.tensor([[0, 4]] * 3), torch.ones(3, 2),
                                   w, torch.randn(4, 16, 4))
    with pytest.raises(ValueError, match="top_k=5; allowed: 1 to the number of experts"):
        moe_route_op.moe_route(torch.randn(3, 4), 5)
    with pytest.raises(ValueError, match="scoring='tanh'; allowed"):
        moe_route_op.moe_route(torch.randn(3, 4), 2, "tanh")
    with pytest.raises(ValueError, match="n_group=3"):
        moe_route_op.moe_route(torch.randn(3, 8), 2, "sigmoid", n_group=3)


def test_fake_kernels_give_the_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        logits = torch.empty(5, 8, dtype=torch.bfloat16)
        w, i = moe_route_op.moe_route(logits, 2, renormalize=True, keep_float=True)
        out = moe_experts_op.moe_experts(torch.empty(5, 16, dtype=torch.bfloat16), i, w,
                                         torch.empty(8, 12, 16, dtype=torch.bfloat16),
                                         torch.empty(8, 16, 6, dtype=torch.bfloat16))
    assert (w.shape, w.dtype, i.dtype) == ((5, 2), torch.float32, torch.int64)
    assert (out.shape, out.dtype) == ((5, 16), torch.bfloat16)


# -- patched models -------------------------------------------------------------------------------

@pytest.mark.slow  # a training step of each model, its MoE kernels under the interpreter
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_moe_models_route_every_router_and_experts_call_and_train_as_before(family):
    m = tiny(family)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    layers = m.config.num_hidden_layers
    with moe_serving(), aten_overrides_off():
        loss, grads = step(m, batch)
        with pn.patched(m, MOE_RULES) as report, pn.trace() as t:
            patched_loss, patched_grads = step(m, batch)
    rules = {e.rule: e.instances for e in report.patched}
    assert rules.get("moe_router") == layers and rules.get("moe_experts") == layers, report
    served = [(e.op, e.module) for e in t.events if e.op.startswith("moe_") and e.outcome == "override"]
    for i in range(layers):
        mlp = f"model.layers.{i}.mlp"
        router = f"{mlp}.{'router' if family == 'gpt_oss' else 'gate'}"
        for op, module in (("moe_route", router), ("moe_route_backward", router), ("moe_experts", f"{mlp}.experts"),
                           ("moe_experts_backward", f"{mlp}.experts")):
            assert served.count((op, module)) == 1, (op, module, served)
    assert not [e for e in t.events if e.op.startswith("moe_") and e.outcome != "override"]
    assert abs(patched_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())
    assert patched_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert_near(patched_grads[name], grad, msg=name)


def assert_unpatch_restores_exactly(m: torch.nn.Module) -> None:
    """A step after patching, stepping and unpatching gives the unpatched step's loss and gradients bit for bit."""
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    with moe_serving(), aten_overrides_off():
        loss, grads = step(m, batch)
        pn.patch(m, MOE_RULES)
        step(m, batch)
        assert pn.unpatch(m)
        again, again_grads = step(m, batch)
    assert torch.equal(again, loss)
    assert not [n for n, mod in m.named_modules() if "forward" in mod.__dict__]
    assert again_grads.keys() == grads.keys() and all(torch.equal(again_grads[n], g) for n, g in grads.items())


@pytest.mark.slow  # three training steps, the patched one's MoE kernels under the interpreter
def test_unpatch_restores_a_moe_model_exactly():
    assert_unpatch_restores_exactly(tiny("qwen3_moe"))


def test_served_by_the_references_a_patched_moe_model_computes_the_unpatched_results_bit_for_bit():
    m = tiny("mixtral", num_experts_per_tok=3)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    with pn.triton.disabled(), moe_serving(everywhere=True), aten_overrides_off():
        out = m(**batch)
        with pn.patched(m, MOE_RULES), pn.trace() as t:
            same = m(**batch)
    assert {e.op for e in t.events if e.outcome == "override"} >= {"moe_route", "moe_experts"}
    assert torch.equal(same.logits, out.logits)


def test_the_loss_rule_steps_aside_while_a_router_auxiliary_loss_is_on():
    m = tiny("mixtral", output_router_logits=True, router_aux_loss_coef=0.01)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    with moe_serving(), aten_overrides_off():
        want = m(**batch).loss
        with pn.patched(m, ["causal_lm_loss", *MOE_RULES]), pn.trace() as t:
            got = m(**batch)
    assert got.aux_loss is not None
    torch.testing.assert_close(got.loss, want, rtol=1e-5, atol=1e-6)
    fused = [e for e in t.events if e.op.startswith("linear_cross_entropy") and e.outcome == "override"]
    assert not fused, fused


@pytest.mark.slow  # a subprocess importing transformers, three variants of a layer
def test_the_moe_layer_benchmark_starts_at_small_shapes_and_its_variants_agree():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "moe_layer.py"
    proc = subprocess.run([sys.executable, str(script), "--small", "--shape", "mixtral", "--tokens", "32", "--repeat",
                           "1", "--interpreted"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in ("eager", "grouped_mm", "python-native")}
    assert set(rows) == {"eager", "grouped_mm", "python-native"}, proc.stdout
    assert all(float(row[-1]) < 1e-5 for row in rows.values()), proc.stdout  # max |diff| against eager
    assert rows["python-native"][1] == "triton" and rows["eager"][1] == "-", proc.stdout


def test_deepseek_v3s_grouped_sigmoid_router_and_shared_experts_are_taken():
    """Its router by the sigmoid variant with groups, bias and scaling, served by the Triton kernels both
    ways; its experts by ``moe_experts``; its shared experts, a gated MLP, by that rule."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    cfg = DeepseekV3Config(hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_group=4, topk_group=2,
                           num_experts_per_tok=3, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
                           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, vocab_size=256,
                           routed_scaling_factor=2.5)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).train()
    with torch.no_grad():
        m.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    batch = tiny_models.example_inputs(m, batch=2, seq=8)
    with moe_serving(), aten_overrides_off():
        loss, grads = step(m, batch)
        with pn.patched(m, [*MOE_RULES, "gated_mlp"]) as report, pn.trace() as t:
            patched_loss, patched_grads = step(m, batch)
    found = {e.rule: (e.target, e.instances) for e in report.patched}
    assert found == {"moe_router": ("DeepseekV3TopkRouter", 1), "moe_experts": ("DeepseekV3Experts", 1),
                     "gated_mlp": ("DeepseekV3MLP", 2)}, report
    for op in ("moe_route", "moe_route_backward"):
        routed = [e.outcome for e in t.events if e.op == op and e.module == "model.layers.1.mlp.gate"]
        assert routed and set(routed) == {"override"}, (op, routed)
    assert [e for e in t.events if e.op == "moe_experts" and e.outcome == "override"]
    assert abs(patched_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())
    for name, grad in grads.items():
        assert_near(patched_grads[name], grad, msg=name)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "olmoe"])
def test_the_router_probe_tells_renormalised_weights_apart_in_bf16(family):
    """Peaked probabilities would round alike renormalised or not: the probe's logits are small."""
    m = tiny(family, torch.bfloat16, **({"norm_topk_prob": False} if family == "olmoe" else {}))
    router, _ = layer_of(m)
    report = pn.patch(m, ["moe_router"], dry_run=True)
    (entry,) = report.patched
    renormalised = getattr(router, "norm_topk_prob", True)
    assert f"renormalize={renormalised}" in entry.detail and f"keep_float={family == 'mixtral'}" in entry.detail
