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


# The rules that route dense pieces: an MoE's experts and router are then left to no rule.
DENSE_RULES = ("rms_norm", "rotary", "causal_lm_loss", "gated_mlp")


def _outside(report) -> dict:
    return {(row.module_class, rule): n for row in report.rows.values() for (rule, _), n in row.outside.items()}


@pytest.mark.parametrize("family, experts, router", [
    ("mixtral", "MixtralExperts", "MixtralTopKRouter"),
    ("qwen3_moe", "Qwen3MoeExperts", "Qwen3MoeTopKRouter"),
    ("olmoe", "OlmoeExperts", "OlmoeTopKRouter"),
])
def test_an_moes_experts_and_router_count_outside_until_a_rule_takes_them(family, experts, router):
    m = model(family)
    with serving(), aten_overrides_off():
        report = pn.reach(m, kwargs=inputs(m), rules=DENSE_RULES)
    outside = _outside(report)
    assert outside[(experts, "moe experts")] == 2 and outside[(router, "moe router")] == 2
    text = str(report)
    assert (f"{experts}: moe experts x2: an MoE's experts (an MLP per expert, 4 stacked in 3-D parameters): "
            "no rule took them; their own code ran") in text
    assert f"{router}: moe router x2: an MoE's router (scores over 4 experts, then top-k)" in text
    assert "0 module calls computed outside" not in text
    with serving(), aten_overrides_off():
        everything = pn.reach(m, kwargs=inputs(m))  # whatever rules take them now are counted from their results
    taken = {name for e in everything.patch.patched for name in e.modules}
    for cls, name in ((experts, "model.layers.0.mlp.experts"), (router, "model.layers.0.mlp.gate")):
        row = everything.rows[cls]
        if name in taken:
            assert ("moe experts" if cls == experts else "moe router") not in {r for r, _ in row.outside}
        else:
            assert sum(row.outside.values()) == 2


class _Expert(torch.nn.Module):
    def __init__(self, gated: bool):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.gate = torch.nn.Linear(8, 16) if gated else None

    def forward(self, x):
        h = torch.relu(self.up(x))
        return self.down(h * self.gate(x) + 1 if self.gate is not None else h)  # no gated-MLP op computes this


class _Moe(torch.nn.Module):
    def __init__(self, gated: bool):
        super().__init__()
        self.router = torch.nn.Linear(8, 3, bias=False)
        self.experts = torch.nn.ModuleList(_Expert(gated) for _ in range(3))

    def forward(self, x):
        top = self.router(x).argmax(-1)
        return sum(e(x) * (top == i)[..., None] for i, e in enumerate(self.experts))


def test_a_list_of_expert_mlps_counts_each_expert_call_outside_once():
    report = pn.reach(_Moe(gated=False), torch.randn(4, 8), patch=False)
    assert _outside(report) == {("_Expert", "moe experts"): 3, ("Linear", "moe router"): 1}
    assert "_Expert: moe experts x3: an MoE's experts (an MLP per expert, 3 in a ModuleList)" in str(report)
    report = pn.reach(_Moe(gated=True), torch.randn(4, 8), patch=False)  # the gated-MLP rule recognises them
    assert sum(report.rows["_Expert"].outside.values()) == 3 and ("_Expert", "moe experts") not in _outside(report)


def _layer_norm(input, normalized_shape, weight, bias, eps):
    """aten's native_layer_norm in plain torch (its result, mean and rstd), for a test override."""
    x = input.float()
    mean = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    out = (x - mean) * rstd
    out = out if weight is None else out * weight.float() + (0 if bias is None else bias.float())
    return out.to(input.dtype), mean, rstd


def test_a_layernorm_that_aten_routes_is_not_also_counted_outside(overrides):
    from conftest import always

    m = model("nemotron")
    overrides("native_layer_norm", always, _layer_norm, public_name="layer_norm")
    with serving():
        report = pn.reach(m, kwargs=inputs(m))
    row = report.rows["NemotronLayerNorm1P"]
    assert row.calls == 5 and row.override["native_layer_norm"] == 5 and not row.outside, row
    assert ("layer_norm", "left alone") in {(e.rule, e.status) for e in report.patch.entries}


def _types(decoder_only: bool) -> list[str]:
    from transformers.models.auto import modeling_auto

    from python_native.tools import tiny_models

    return [t for t in sorted(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
            if (tiny_models.decoder_only(t) is None) == decoder_only]


def _reach_or_refuse(family: str, capsys) -> tuple[int, dict]:
    """The command's JSON answer for ``family``: a report, or an error in one line."""
    status = main(["reach", "--model", family, "--json"])
    data = json.loads(capsys.readouterr().out)
    if status == 0:
        assert data["rows"] and data["patch"]["model"] == data["model"], family
    else:
        assert status == 2 and "\n" not in data["error"] and data["error"].startswith("--model"), (family, data)
    return status, data


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "falcon", "mamba", "qwen3_next"])
def test_the_command_reaches_each_family_that_failed_before(family, capsys):
    with pn.triton.disabled():  # the step in plain torch: what is asked here is that the command runs
        status, data = _reach_or_refuse(family, capsys)
    assert status == 0, data


def test_the_command_refuses_a_type_that_is_no_decoder_only_model_in_one_line(capsys):
    assert main(["reach", "--model", "bert"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m python_native reach: --model: model type 'bert' is a masked-LM encoder "
        "(its causal LM is that encoder run as a decoder)")
    assert "is an encoder-decoder model" in _reach_or_refuse("bart", capsys)[1]["error"]
    assert "is multimodal" in _reach_or_refuse("llama4", capsys)[1]["error"]


@pytest.mark.slow
def test_the_command_reaches_or_refuses_every_causal_lm_type_installed(capsys):
    """Every decoder-only type runs its step or is refused in one line; the others are refused. The
    backends are held off (plain torch computes each step: the interpreter would take hours)."""
    with pn.triton.disabled():
        ran = [t for t in _types(decoder_only=True) if _reach_or_refuse(t, capsys)[0] == 0]
        refused = [t for t in _types(decoder_only=False) if _reach_or_refuse(t, capsys)[0] == 2]
    assert len(ran) >= 0.8 * len(_types(decoder_only=True)) and refused == _types(decoder_only=False)


class _Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale, self.eps = torch.nn.Parameter(torch.ones(8)), 1e-6

    def forward(self, x):
        h = x.float()
        return self.scale * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def test_a_patched_rule_counts_the_calls_it_handed_back_and_names_their_shape():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), _Norm())
    x = torch.randn(4, 8)
    with serving():
        served = pn.reach(m, x)
        handed = pn.reach(m.double(), x.double())  # float64: a dtype the norm's probe did not confirm
    assert served.rows["_Norm"].override["rms_norm"] == 1 and not served.rows["_Norm"].outside
    assert _outside(handed) == {("_Norm", "rms_norm"): 1} and "rms_norm" not in handed.rows["_Norm"].override
    text = str(handed)
    assert ("patched, but these calls ran their own code (a shape or dtype its probe did not confirm, or no override "
            "active):\n  _Norm: rms_norm x1: input torch.float64 (4, 8): a dtype the probe did not confirm: the "
            "module's own forward ran") in text
    assert "1 module calls computed outside the package" in text
