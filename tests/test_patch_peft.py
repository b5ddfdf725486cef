"""``pn.patch`` on a PEFT LoRA model: the gated-MLP rule takes MLPs whose projections are LoRA
layers, calling each layer as it is (its base linear plus its adapter's delta, its dropout), then the
gated op. Loss and LoRA gradients match the unpatched model, with the adapters' dropout on too;
``unpatch`` restores the model, and PEFT's ``merge_and_unload`` works after it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

# isort: split
import peft
from patch_testing import aten_overrides_off, inputs, serving, step

import python_native as pn
from python_native.tools import tiny_models

MLP = ["gate_proj", "up_proj", "down_proj"]
MLP_NAME = "base_model.model.model.layers.0.mlp"


def lora_llama(dropout: float = 0.0, layers: int = 2) -> torch.nn.Module:
    """A tiny Llama with LoRA on its MLP projections and q/v, adapters random (a delta that counts)."""
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=[*MLP, "q_proj", "v_proj"],
                             init_lora_weights=False)
    torch.manual_seed(1)
    return peft.get_peft_model(tiny_models.build("llama", num_hidden_layers=layers), config)  # no dropout of its own


def seeded_step(m: torch.nn.Module, batch: dict, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    return step(m, batch)


def assert_same_training(got, want) -> None:
    (loss, grads), (want_loss, want_grads) = got, want
    assert abs(loss.item() - want_loss.item()) <= 1e-6 * abs(want_loss.item())
    assert grads.keys() == want_grads.keys() and all("lora_" in n for n in grads)
    assert any(n.endswith("mlp.gate_proj.lora_B.default.weight") for n in grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.override
def test_lora_projections_are_patched_and_train_as_the_unpatched_model():
    m = lora_llama()
    batch = inputs(m)
    with serving(), aten_overrides_off():
        want = step(m, batch)
        with pn.patched(m) as report:
            with pn.trace() as t:
                got = step(m, batch)
    (mlp,) = [e for e in report.patched if e.rule == "gated_mlp"]
    assert mlp.instances == 2 and mlp.detail.startswith("swiglu; gate=gate_proj, up=up_proj, down=down_proj")
    assert "gate_proj, up_proj, down_proj wrap their Linear" in mlp.detail
    assert_same_training(got, want)
    served = {(e.op, e.module) for e in t.events if e.outcome == "override"}
    assert ("swiglu", MLP_NAME) in served and ("swiglu_backward", MLP_NAME) in served, t.table(limit=None)


@pytest.mark.override
def test_the_adapters_dropout_in_training_draws_what_the_module_draws():
    m = lora_llama(dropout=0.25).train()
    batch = inputs(m)
    with serving(), aten_overrides_off():
        want = seeded_step(m, batch, seed=7)
        assert not torch.equal(want[0], seeded_step(m, batch, seed=8)[0])  # the dropout does draw
        state = torch.random.get_rng_state()
        with pn.patched(m) as report:  # probed in training mode: dropout on
            assert torch.equal(torch.random.get_rng_state(), state)  # the probes' seeds leave the user's stream
            with pn.trace() as t:
                got = seeded_step(m, batch, seed=7)
    assert "gated_mlp" in {e.rule for e in report.patched}, report
    assert_same_training(got, want)
    assert ("swiglu", MLP_NAME) in {(e.op, e.module) for e in t.events if e.outcome == "override"}


def test_unpatch_restores_the_lora_model_and_merge_and_unload_works_after():
    m = lora_llama(layers=1)
    ids = inputs(m)["input_ids"]  # no labels: the logits (the fused loss returns none)
    with aten_overrides_off(), torch.no_grad():
        logits = m(input_ids=ids).logits
        with pn.patched(m):
            patched = m(input_ids=ids).logits
        assert not [n for n, mod in m.named_modules() if "forward" in mod.__dict__]
        assert torch.equal(m(input_ids=ids).logits, logits)
        merged = m.merge_and_unload()
        assert isinstance(merged.model.layers[0].mlp.gate_proj, torch.nn.Linear)
        torch.testing.assert_close(merged(input_ids=ids).logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(patched, logits, rtol=1e-5, atol=1e-6)


def test_adapters_switched_off_or_merged_while_patched_are_the_wrappers_own():
    m = lora_llama(layers=1)
    ids = inputs(m)["input_ids"]
    with aten_overrides_off(), torch.no_grad():
        with m.disable_adapter():
            base = m(input_ids=ids).logits
        with_adapters = m(input_ids=ids).logits
        with pn.patched(m) as report:
            assert "gated_mlp" in {e.rule for e in report.patched}, report
            with m.disable_adapter():
                patched_base = m(input_ids=ids).logits
            m.merge_adapter()
            merged = m(input_ids=ids).logits
            m.unmerge_adapter()
    assert not torch.allclose(base, with_adapters)  # the adapters change the model
    torch.testing.assert_close(patched_base, base, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(merged, with_adapters, rtol=1e-5, atol=1e-5)
