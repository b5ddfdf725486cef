"""``pn.patch`` on tiny randomly initialised transformers models (Llama, Qwen2, Gemma, GPT-2, built
from configs): every norm, MLP activation and rotary application reaches an override; loss and
gradients match the unpatched model; ``unpatch`` restores it bit for bit; with the DSLs off a
patched model computes the unpatched model's results."""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import FAMILIES, OURS, aten_overrides_off, inputs, model, serving, step

import python_native as pn
from conftest import TEST_DSL
from python_native.core.registry import REGISTRY

NORM_OPS = {"rms_norm", "rms_norm_backward", "native_layer_norm", "native_layer_norm_backward"}
EXPECTED_RULES = {
    "llama": {"rms_norm", "gated_mlp", "rotary", "causal_lm_loss"},
    "qwen2": {"rms_norm", "gated_mlp", "rotary", "causal_lm_loss"},
    "gemma": {"rms_norm", "gated_mlp", "rotary", "causal_lm_loss"},
    "gpt2": {"activation", "causal_lm_loss"},
}
OP_OF_RULE = {"rms_norm": ("rms_norm",), "gated_mlp": ("swiglu", "geglu"), "activation": ("gelu_tanh", "quick_gelu")}


def _aten_norm_at_cpu() -> bool:
    """Whether an override of aten's layer norm sits at the CPU key (the Triton kernels, interpreted)."""
    slot = REGISTRY.slots.get(("aten", "native_layer_norm", "CPU"))
    return slot is not None and bool(slot.overrides)


def _served(row, ops) -> tuple[int, int]:
    """(forward, backward) override calls of ``ops`` in a reach row."""
    forward = sum(n for op, n in row.override.items() if op in ops)
    backward = sum(n for op, n in row.override.items() if op.removesuffix("_backward") in ops and op.endswith("_backward"))
    return forward, backward


@pytest.mark.parametrize("family", FAMILIES)
def test_every_norm_activation_and_rotary_call_runs_through_an_override(family):
    m = model(family)
    with serving(), pn.patched(m) as report:
        reach = pn.reach(m, kwargs=inputs(m))
    assert {e.rule for e in report.patched} == EXPECTED_RULES[family], report
    rows = reach.rows
    for entry in report.patched:
        if entry.rule in OP_OF_RULE:  # each call of each instance: its op forward and backward
            row = rows[entry.target]
            assert row.calls == entry.instances
            assert _served(row, OP_OF_RULE[entry.rule]) == (row.calls, row.calls), (entry, reach)
        elif entry.rule == "rotary":
            callers = {type(m.get_submodule(name)).__name__ for name in entry.modules}
            for cls in callers:
                assert _served(rows[cls], ("rotary",)) == (rows[cls].calls, rows[cls].calls), reach
    # Every norm: its forward op in its own row; aten's backwards run outside any module's scope. A
    # norm no rule patches (GPT-2's LayerNorm) reaches an override of aten's op only where one sits
    # at the CPU key (the Triton kernels under the interpreter; on a GPU machine they serve CUDA).
    patched = {e.target for e in report.patched}
    norms = [row for cls, row in rows.items() if "Norm" in cls and (cls in patched or _aten_norm_at_cpu())]
    assert norms or (family == "gpt2" and not _aten_norm_at_cpu()), reach
    assert all(sum(n for op, n in row.override.items() if op in NORM_OPS) >= row.calls for row in norms)
    backwards = sum(n for row in rows.values() for op, n in row.override.items() if op in NORM_OPS and "backward" in op)
    assert backwards == sum(row.calls for row in norms), reach
    root = rows[type(m).__name__]
    assert root.override["linear_cross_entropy.forward"] == 1
    falling = [(r.module_class, op, why) for r in rows.values() for (op, why), n in r.fallback.items() if op in OURS]
    assert not falling, falling
    assert reach.totals()[2] == 0  # nothing a rule recognises computed outside the package


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_and_gradients_match_the_unpatched_model(family):
    m = model(family)
    batch = inputs(m)
    with serving(), aten_overrides_off():
        loss, grads = step(m, batch)
        with pn.patched(m):
            patched_loss, patched_grads = step(m, batch)
    assert abs(patched_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())
    assert patched_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(patched_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_stays_as_close_to_fp32_as_the_unpatched_model(family):
    fp32 = model(family)
    bf16 = model(family, dtype=torch.bfloat16)
    batch = inputs(fp32)
    with serving(), aten_overrides_off():
        exact, _ = step(fp32, batch)
        plain, _ = step(bf16, batch)
        with pn.patched(bf16):
            patched, _ = step(bf16, batch)
    plain_error = abs(plain.item() - exact.item())
    assert patched.dtype == plain.dtype == torch.float32  # the loss is reduced in fp32 either way
    assert abs(patched.item() - exact.item()) <= 1.5 * plain_error + 2e-3 * abs(exact.item()), (plain_error, patched)


def test_unpatch_restores_the_model_and_its_functions_exactly():
    m = model("llama")
    batch = inputs(m)
    modeling = sys.modules[type(m).__module__]
    original = modeling.apply_rotary_pos_emb
    with aten_overrides_off():
        loss, grads = step(m, batch)
        logits = m(**batch).logits
        pn.patch(m)
        assert modeling.apply_rotary_pos_emb is not original
        assert pn.patch(m) is pn.patch(m)  # patching a patched model changes nothing
        step(m, batch)
        assert pn.unpatch(m) and not pn.unpatch(m)
        again, again_grads = step(m, batch)
        assert torch.equal(again, loss) and torch.equal(m(**batch).logits, logits)
    assert modeling.apply_rotary_pos_emb is original
    assert not [n for n, mod in m.named_modules() if "forward" in mod.__dict__]
    assert all(torch.equal(again_grads[n], g) for n, g in grads.items())


@pytest.mark.parametrize("family", FAMILIES)
def test_with_the_dsls_off_a_patched_model_computes_the_unpatched_results(family):
    m = model(family)
    batch = inputs(m)
    everything_but_the_loss = [r.name for r in pn.patch_rules() if r.name != "causal_lm_loss"]
    with pn.triton.disabled(), getattr(pn, TEST_DSL).disabled():
        out, (loss, grads) = m(**batch), step(m, batch)
        with pn.patched(m, everything_but_the_loss):
            same = m(**batch)
            same_loss, same_grads = step(m, batch)
        with pn.patched(m):
            fused_loss, fused_grads = step(m, batch)
    assert torch.equal(same.logits, out.logits) and torch.equal(same.loss, out.loss)  # bit for bit
    assert torch.equal(same_loss, loss)
    for name, grad in grads.items():
        torch.testing.assert_close(same_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert abs(fused_loss.item() - loss.item()) <= 1e-5 * abs(loss.item())


def test_the_trace_names_each_patched_calls_module_and_why_it_fell_back():
    m = model("llama", num_hidden_layers=1)
    with serving(), pn.patched(m):
        with pn.trace() as t:
            m(**inputs(m)).loss.backward()
        ours = {(e.op, e.module) for e in t.events if e.op in OURS and e.outcome == "override"}
        assert ("rms_norm", "model.layers.0.input_layernorm") in ours
        assert ("rms_norm_backward", "model.layers.0.input_layernorm") in ours  # the backward keeps the module
        assert ("swiglu", "model.layers.0.mlp") in ours and ("rotary", "model.layers.0.self_attn") in ours
        assert ("linear_cross_entropy.backward", "LlamaForCausalLM") in ours
        assert "model.layers.0.mlp" in t.table(limit=None)
        with pn.operations_disabled("swiglu", "rotary"), pn.trace() as t:
            m(**inputs(m)).loss.backward()
    # No override serves them: the patched forwards ran the modules' own code (no op, so no backward event).
    off = {(e.op, e.outcome, e.module) for e in t.events if e.op.startswith(("swiglu", "rotary"))}
    assert off == {("swiglu", "fallback", "model.layers.0.mlp"), ("rotary", "fallback", "model.layers.0.self_attn")}
    assert all("disabled" in e.reason for e in t.events if e.op.startswith(("swiglu", "rotary")))


def test_a_dtype_the_probe_did_not_confirm_runs_the_modules_own_code_and_says_why():
    norm = model("llama", num_hidden_layers=1).model.norm
    x = torch.randn(2, 64, dtype=torch.float64)
    want = norm(x)
    with serving(), pn.patched(norm) as report, pn.trace() as t:
        got = norm(x)
    assert report.patched[0].rule == "rms_norm"
    assert torch.equal(got, want)
    (event,) = [e for e in t.events if e.op == "rms_norm"]
    assert event.outcome == "fallback" and "float64" in event.reason and event.module == "LlamaRMSNorm"


def test_another_model_of_the_family_keeps_its_own_functions():
    patched, plain = model("llama", num_hidden_layers=1), model("llama", num_hidden_layers=1)
    with serving(), aten_overrides_off(), pn.patched(patched), pn.trace() as t:
        plain(**inputs(plain))
    assert not [e for e in t.events if e.op == "rotary"]


def test_the_report_says_what_was_left_alone_and_why():
    report = pn.patch(model("gemma2"), dry_run=True)
    (loss,) = [e for e in report.left_alone if e.rule == "causal_lm_loss"]
    assert "final_logit_softcapping=30.0" in loss.detail and loss.target == "Gemma2ForCausalLM"
    assert {e.status for e in report.patched} == {"would patch"}
    assert "left alone" in str(report) and "rms_norm" in str(report)


@pytest.mark.override
@pytest.mark.parametrize("family", FAMILIES)
def test_in_eval_mode_the_patched_model_returns_its_logits_and_loss_as_unpatched(family):
    """The fused loss serves training steps only: in eval mode the model's own forward runs (bit for
    bit the unpatched model, the loss rule alone patched), and the trace says why."""
    m = model(family).eval()
    batch = inputs(m)
    with serving(), aten_overrides_off():
        want = m(**batch)
        with pn.patched(m, ["causal_lm_loss"]):
            with pn.trace() as evaluating:
                got = m(**batch)
            m.train()
            with pn.trace() as training:
                trained = m(**batch)
    assert torch.equal(got.logits, want.logits) and torch.equal(got.loss, want.loss)
    (event,) = [e for e in evaluating.events if e.op.startswith("linear_cross_entropy")]
    assert event.outcome == "fallback" and "eval mode" in event.reason and event.module == type(m).__name__
    assert trained.logits is None  # the fused loss: no logits computed
    assert abs(trained.loss.item() - want.loss.item()) <= 1e-5 * abs(want.loss.item())
    assert not [e for e in training.events if "eval mode" in (e.reason or "")]
    assert "linear_cross_entropy.forward" in {e.op for e in training.events}
