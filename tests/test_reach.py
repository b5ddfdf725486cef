"""``pn.reach`` and ``python -m python_native reach``: one training step tabled per module class."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import OURS, aten_overrides_off, inputs, model, serving

import python_native as pn
from python_native.__main__ import main


def test_a_patched_step_shows_each_class_served_and_leaves_the_model_as_it_was():
    m = model("llama")
    with serving(), aten_overrides_off():
        report = pn.reach(m, kwargs=inputs(m))
    rows = report.rows
    assert rows["LlamaRMSNorm"].override == {"rms_norm": 5, "rms_norm_backward": 5}
    assert rows["LlamaMLP"].override == {"swiglu": 2, "swiglu_backward": 2}
    assert rows["LlamaAttention"].override == {"rotary": 2, "rotary_backward": 2}
    assert rows["LlamaForCausalLM"].override == {"linear_cross_entropy.forward": 1, "linear_cross_entropy.backward": 1}
    assert report.totals()[0] == 20 and report.totals()[2] == 0 and report.unserved == []
    assert not [op for row in rows.values() for (op, _) in row.fallback if op in OURS]  # the rest: aten's, held off
    assert not pn.patching.is_patched(m) and all(p.grad is None for p in m.parameters())
    text = str(report)
    assert "LlamaRMSNorm" in text and "rms_norm x5, rms_norm_backward x5" in text
    json.dumps(report.to_dict())  # plain data


def test_an_unpatched_step_shows_what_a_rule_could_take():
    m = model("llama")
    with aten_overrides_off():
        report = pn.reach(m, kwargs=inputs(m), patch=False)
    outside = {(row.module_class, rule): n for row in report.rows.values() for (rule, _), n in row.outside.items()}
    assert outside == {("LlamaRMSNorm", "rms_norm"): 5, ("LlamaMLP", "gated_mlp"): 2,
                       ("LlamaAttention", "rotary (apply_rotary_pos_emb)"): 2, ("LlamaForCausalLM", "causal_lm_loss"): 1}
    assert "outside the package (a rule recognises them)" in str(report)


def test_the_command_reaches_a_built_in_model_and_a_users_script(tmp_path, capsys):
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent("""
        import torch

        class Act(torch.nn.Module):
            def forward(self, x):
                return x * torch.sigmoid(1.702 * x)

        def build():
            return torch.nn.Sequential(torch.nn.Linear(8, 8), Act()), (torch.randn(4, 8),)
    """))
    with serving(), aten_overrides_off():
        assert main(["reach", "--script", str(script)]) == 0
        out = capsys.readouterr().out
        assert "activation  Act" in out and "quick_gelu x1, quick_gelu_backward x1" in out
        assert main(["reach", "--model", "qwen2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["module_class"]: r for r in data["rows"]}
    assert rows["Qwen2RMSNorm"]["override"] == {"rms_norm": 5, "rms_norm_backward": 5}


def test_the_command_names_a_bad_model_and_a_bad_script(tmp_path, capsys):
    """One line naming the value, exit status 2 (``python_native.tools.commands.usage``)."""
    assert main(["reach", "--model", "lama"]) == 2
    assert "no transformers model type is named 'lama'" in capsys.readouterr().err
    script = tmp_path / "empty.py"
    script.write_text("x = 1\n")
    assert main(["reach", "--script", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m python_native reach: --script") and "defines no build() function" in err


def test_reach_needs_a_module_and_a_loss():
    with pytest.raises(TypeError, match="pn.reach takes an nn.Module"):
        pn.reach(lambda x: x)
    with pytest.raises(TypeError, match="cannot find a loss"):
        pn.reach(_NoTensor(), torch.ones(2), patch=False)


class _NoTensor(torch.nn.Module):
    def forward(self, x):
        return {"nothing": None}
