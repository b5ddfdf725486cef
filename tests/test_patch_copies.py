"""A patched model's copies: ``copy.deepcopy``, ``pickle`` and ``torch.save`` carry the patch over
the copy's own modules (its weights compute, its parameters get the gradients), ``pn.unpatch``
undoes each, and a patched forward keeps the signature of the forward it stands for. A deep copy of
a patched part (a decoder layer) computes with its own weights and unpatches alone; ``copy.copy``
is the same patched model under a second name, unpatched through either."""

from __future__ import annotations

import copy
import gc
import inspect
import io
import pickle
import sys

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import aten_overrides_off, inputs, model, serving

import python_native as pn


def _unpatched_twin(m: torch.nn.Module) -> torch.nn.Module:
    twin = model("llama")
    twin.load_state_dict(m.state_dict())
    return twin


def _overridden(trace) -> set[tuple[str, str]]:
    return {(e.op, e.module) for e in trace.events if e.outcome == "override" and e.module}


def _instance_forwards(m: torch.nn.Module) -> list[str]:
    return [n for n, mod in m.named_modules() if "forward" in mod.__dict__]


def test_a_deep_copy_computes_with_its_own_weights_through_the_overrides():
    m = model("llama")
    batch = {"input_ids": inputs(m)["input_ids"]}
    with serving(), aten_overrides_off():
        pn.patch(m)
        try:
            before = m(**batch).logits
            twin = copy.deepcopy(m)
            with torch.no_grad():
                for p in twin.parameters():
                    p.mul_(1.25)
            with pn.trace() as t:
                got = twin(**batch).logits
            want = _unpatched_twin(twin)(**batch).logits
            assert (got - before).abs().max() > 1e-2  # not the original's weights
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert torch.equal(m(**batch).logits, before)
            served = _overridden(t)
            assert {("rms_norm", "model.norm"), ("swiglu", "model.layers.0.mlp"),
                    ("rotary", "model.layers.1.self_attn")} <= served, served
            assert pn.unpatch(twin)
        finally:
            pn.unpatch(m)


def test_a_deep_copys_gradients_reach_its_own_parameters():
    m = model("llama")
    batch = inputs(m)
    with serving(), aten_overrides_off():
        pn.patch(m)
        try:
            twin = copy.deepcopy(m)
            with pn.trace() as t:
                twin(**batch).loss.backward()
            assert all(p.grad is None for p in m.parameters())
            assert all(p.grad is not None for p in twin.parameters())
            assert ("linear_cross_entropy.forward", "LlamaForCausalLM") in {
                (e.op, e.module) for e in t.events} and ("rms_norm_backward", "model.norm") in _overridden(t)
            twin.zero_grad(set_to_none=True)
            m(**batch).loss.backward()
            assert all(p.grad is None for p in twin.parameters())
            assert pn.unpatch(twin)
        finally:
            pn.unpatch(m)


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_pickled_patched_model_loads_patched_and_computes_as_the_original(how):
    m = model("llama")
    batch = inputs(m)
    with serving(), aten_overrides_off():
        pn.patch(m)
        try:
            if how == "pickle":
                loaded = pickle.loads(pickle.dumps(m))
            else:
                buffer = io.BytesIO()
                torch.save(m, buffer)
                buffer.seek(0)
                loaded = torch.load(buffer, weights_only=False)
            assert pn.patch(loaded) is not pn.patch(m)  # patched already: its own report
            with pn.trace() as t:
                out = loaded(**batch)
            assert torch.equal(out.loss, m(**batch).loss)
            assert ("swiglu", "model.layers.1.mlp") in _overridden(t)
            assert torch.equal(loaded(input_ids=batch["input_ids"]).logits, m(input_ids=batch["input_ids"]).logits)
            assert pn.unpatch(loaded) and not _instance_forwards(loaded)
        finally:
            pn.unpatch(m)


def test_unpatch_undoes_the_original_each_copy_and_the_loaded_model():
    m = model("llama")
    modeling = sys.modules[type(m).__module__]
    original = modeling.apply_rotary_pos_emb
    batch = inputs(m)
    with serving(), aten_overrides_off():
        plain = m(**batch).logits
        pn.patch(m)
        copies = [copy.deepcopy(m), pickle.loads(pickle.dumps(m))]
        buffer = io.BytesIO()
        torch.save(m, buffer)
        buffer.seek(0)
        copies.append(torch.load(buffer, weights_only=False))
        assert pn.unpatch(m) and not pn.unpatch(m)
        assert not _instance_forwards(m)
        assert modeling.apply_rotary_pos_emb is not original  # the copies still call the replacement
        for each in copies:
            assert pn.unpatch(each) and not pn.unpatch(each)
            assert not _instance_forwards(each)
            assert torch.equal(each(**batch).logits, plain)
        assert modeling.apply_rotary_pos_emb is original
        assert pickle.loads(pickle.dumps(m))(**batch).logits.equal(plain)  # unpatched: copies are plain


def test_a_patched_forward_keeps_the_signature_of_the_forward_it_stands_for():
    m = model("llama")
    before = {n: inspect.signature(mod.forward) for n, mod in m.named_modules()}
    with pn.patched(m):
        patched = [n for n, mod in m.named_modules() if "forward" in mod.__dict__]
        assert len(patched) > 5, patched
        assert {n: inspect.signature(mod.forward) for n, mod in m.named_modules()} == before
        twin = copy.deepcopy(m)
        assert {n: inspect.signature(mod.forward) for n, mod in twin.named_modules()} == before
        pn.unpatch(twin)


def test_a_copy_collected_while_patched_gives_its_share_of_the_functions_back():
    m = model("llama")
    modeling = sys.modules[type(m).__module__]
    current = modeling.apply_rotary_pos_emb
    original = getattr(current, "__python_native_original__", current)
    with pn.patched(m):
        twin = copy.deepcopy(m)
    assert modeling.apply_rotary_pos_emb is not original  # the copy still calls the replacement
    del twin
    gc.collect()
    assert modeling.apply_rotary_pos_emb is original


def test_trainer_with_its_defaults_trains_a_patched_model(tmp_path):
    """``remove_unused_columns=True`` (the default) keeps the columns the forward's signature names."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    m = model("llama").train()
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": (ids := torch.randint(3, 256, (16,), generator=g)), "labels": ids.clone()} for _ in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, save_strategy="no")
    with serving(), aten_overrides_off(), pn.patched(m), pn.trace() as t:
        out = Trainer(model=m, args=args, train_dataset=rows).train()
    assert out.global_step == 2 and torch.isfinite(torch.tensor(out.training_loss))
    ran = {(e.op, e.module) for e in t.events}
    assert ("linear_cross_entropy.forward", "LlamaForCausalLM") in ran
    assert ("swiglu", "model.layers.0.mlp") in _overridden(t)


@pytest.mark.override
@pytest.mark.parametrize("through", ["the copy", "the original"])
def test_a_shallow_copy_is_the_same_patched_model_and_unpatches_with_it(through):
    """``copy.copy`` shares the submodules, parameters and patch (as for any module); its ``train()``
    and ``eval()`` switch the shared modules, the fused loss included; ``pn.unpatch`` through either
    handle unpatches both."""
    m = model("llama")
    batch = inputs(m)
    with serving(), aten_overrides_off():
        plain = m.eval()(**batch)
        m.train()
        pn.patch(m)
        try:
            shallow = copy.copy(m)
            assert shallow is not m and shallow.model is m.model and pn.patching.is_patched(shallow)
            with pn.trace() as t:
                trained = shallow(**batch)
            assert trained.logits is None and ("swiglu", "model.layers.0.mlp") in _overridden(t)  # fused
            torch.testing.assert_close(trained.loss, plain.loss, rtol=1e-5, atol=1e-5)
            shallow.eval()
            evaluated = shallow(**batch)
            torch.testing.assert_close(evaluated.logits, plain.logits, rtol=1e-5, atol=1e-5)
            assert m(**batch).logits is not None  # the original's modules are the copy's: in eval mode too
            assert pn.unpatch(shallow if through == "the copy" else m)
            for each in (m, shallow):
                assert not pn.patching.is_patched(each) and not _instance_forwards(each) and not pn.unpatch(each)
                assert torch.equal(each(**batch).logits, plain.logits)
        finally:
            pn.unpatch(m)


@pytest.mark.override
def test_a_deep_copy_of_a_patched_layer_computes_with_its_own_weights_and_unpatches_alone():
    m = model("llama")
    hidden = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    rotary = m.model.rotary_emb(hidden, torch.arange(16)[None].expand(2, -1))
    with serving(), aten_overrides_off():
        pn.patch(m)
        try:
            layer = m.model.layers[0]
            twin = copy.deepcopy(layer)
            with torch.no_grad():
                for p in twin.parameters():
                    p.mul_(1.25)
            with pn.trace() as t:
                got = twin(hidden, position_embeddings=rotary)
            assert {("rms_norm", "model.layers.0.input_layernorm"), ("swiglu", "model.layers.0.mlp"),
                    ("rotary", "model.layers.0.self_attn")} <= _overridden(t), _overridden(t)
            assert (got - layer(hidden, position_embeddings=rotary)).abs().max() > 1e-2  # not the original's weights
            with pytest.raises(ValueError, match=r"belong to a patched model; unpatch the model pn.patch was given"):
                pn.unpatch(layer)  # a live part of the patched model
            assert pn.unpatch(twin) and not _instance_forwards(twin) and not pn.unpatch(twin)
            assert "forward" in layer.mlp.__dict__  # the original stays patched
            with pn.trace() as t:
                want = twin(hidden, position_embeddings=rotary)
            assert not [e for e in t.events if e.op in ("rms_norm", "swiglu")]  # its own code ran
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        finally:
            pn.unpatch(m)
