"""The rotary rule over every layout transformers writes: half-split (full or partial head dim),
half-width tables (GPT-OSS), interleaved pairs returned half-split (DeepSeek) or kept in place
(GLM), each confirmed bit for bit by its probe and served by an override on every call of a tiny
model; complex-valued rotary (Llama 4) recognised and left alone with the reason."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import aten_overrides_off, inputs, model, serving

import python_native as pn
from python_native.ops import rotary_op
from python_native.patching.op_rules import rotary

LAYOUTS = {  # family -> (function, what the report says)
    "gpt_neox": ("apply_rotary_pos_emb", "half-split; tables over the full head dim or its first part"),
    "nemotron": ("apply_rotary_pos_emb", "half-split; tables over the full head dim or its first part"),
    "qwen3_next": ("apply_rotary_pos_emb", "half-split; tables over the full head dim or its first part"),
    "gpt_oss": ("apply_rotary_pos_emb", "half-width tables; tables over the full head dim"),
    "deepseek_v3": ("apply_rotary_pos_emb_interleave", "interleaved, split out; tables over the full head dim"),
    "glm4": ("apply_rotary_pos_emb", "interleaved; tables over the full head dim or its first part"),
}


def _rotary_entries(report) -> dict[str, tuple[str, str]]:
    return {e.target.rpartition(".")[2]: (e.status, e.detail) for e in report.entries if e.rule == "rotary"}


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_each_layout_is_confirmed_and_every_call_served_bit_for_bit(family):
    m = model(family)
    batch = {"input_ids": inputs(m)["input_ids"]}  # no labels: the logits are computed, patched or not
    with serving(everywhere=True), pn.triton.disabled(), aten_overrides_off():
        want = m(**batch).logits
        with pn.patched(m) as report, pn.trace() as t:
            got = m(**batch).logits
    function, detail = LAYOUTS[family]
    status, found = _rotary_entries(report)[function]
    assert status == "patched" and found.endswith(detail), report
    rotary_events = [e for e in t.events if e.op == "rotary"]
    assert rotary_events and all(e.outcome == "override" for e in rotary_events), [e.reason for e in rotary_events]
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_complex_rotary_is_left_alone_saying_why():
    report = pn.patch(model("llama4_text"), dry_run=True)
    status, why = _rotary_entries(report)["apply_rotary_emb"]
    assert status == "left alone" and why.startswith("rotates q and k by complex products with a freqs_cis table")


def _half_split(q, k, cos, sin, unsqueeze_dim=1):  # full width only, as Llama writes it
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotary_op.rotate_half(q) * sin, k * cos + rotary_op.rotate_half(k) * sin


def test_a_call_shape_the_probe_did_not_confirm_runs_the_function_and_says_so():
    plan = rotary.match_rotary(_half_split)
    assert plan.widths == {"full"} and plan.layout == "half-split"
    replaced = rotary.replace_rotary(_half_split, plan)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    with serving(everywhere=True), pn.trace() as t:
        try:
            replaced(q, k, cos, sin)  # the function's own code: a broadcast error, as unpatched
        except RuntimeError:
            pass
    (event,) = [e for e in t.events if e.op == "rotary"]
    assert event.outcome == "fallback" and event.reason == (
        "patch: q (1, 2, 3, 8) with tables (1, 3, 4): tables over part of the head dim, where the probe confirmed "
        "tables over the full head dim: the function's own code ran")


def test_a_rotation_of_another_layout_is_left_alone_with_the_layouts_named():
    def swapped(q, k, cos, sin):  # pairs (i, i + d/2), rotated the other way round
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos - rotary_op.rotate_half(q) * sin, k * cos - rotary_op.rotate_half(k) * sin

    found = rotary.match_rotary(swapped)
    assert isinstance(found, pn.LeftAlone) and found.reason.startswith("rotates q and k in a layout none of rotary's")
