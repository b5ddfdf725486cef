"""``python -m python_native bench``'s MoE rows: routing and a routed layer's experts, at a tiny shape
through the public command, their kernels seen in a trace, and the row shapes and figures named."""

from __future__ import annotations

import json

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
import python_native_dsls.triton as backend
from python_native.__main__ import main
from python_native.tools import bench

pytestmark = pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
QWEN3_MOE = (8192, 2048, 768, 128, 8)  # Qwen3-30B-A3B's layer: tokens, hidden, intermediate, experts, top k


def test_the_rows_reach_both_ops_forward_and_backward():
    """One row's call, as the command times it, served by the Triton kernels both ways."""
    for op, symbols in (("moe_route", {"moe_route", "moe_route_backward"}),
                        ("moe_experts", {"moe_experts", "moe_experts_backward"})):
        case = bench.Case(op, "fwd+bwd", bench.rows.DECLARED[op].quick[0], torch.float32)
        inputs = bench.make_inputs(case, backend.device_type())
        with pn.trace() as t:
            bench.rows.backward(bench.rows.torch_function(op)(inputs), inputs.dy)
        assert symbols <= {e.op for e in t.events if (e.dsl, e.outcome) == ("triton", "override")}, op
        assert all(leaf.grad is not None for leaf in inputs.leaves)
    assert bench.symbols_of(["moe_route", "moe_experts"]) == [
        "moe_route", "moe_route_backward", "moe_experts", "moe_experts_backward"]


def test_full_rows_hold_a_small_layer_and_qwen3_moe_in_bfloat16():
    full = [c for c in bench.rows.cases([torch.bfloat16], quick=False, ops=["moe_route", "moe_experts"])]
    assert [(c.op, c.mode, c.shape) for c in full] == [
        (op, mode, shape) for op, shapes in (("moe_route", [(2048, 64, 8), (8192, 128, 8)]),
                                             ("moe_experts", [(2048, 1024, 512, 16, 4), QWEN3_MOE]))
        for shape in shapes for mode in ("fwd", "fwd+bwd")]
    # The least any kernel moves: the experts' weights once, each token's row in and out, its routing.
    tokens, hidden, inner, experts, k = QWEN3_MOE
    weights, acts = 3 * experts * inner * hidden * 2, tokens * (2 * hidden * 2 + k * (2 + 8))
    assert bench.bytes_moved(bench.Case("moe_experts", "fwd", QWEN3_MOE, torch.bfloat16)) == weights + acts
    flops = bench.rows.DECLARED["moe_experts"].flops
    assert flops(QWEN3_MOE, "fwd") == 2 * tokens * k * 3 * inner * hidden
    assert flops(QWEN3_MOE, "fwd+bwd") == 3 * flops(QWEN3_MOE, "fwd")


@pytest.mark.slow  # four rows timed through Triton's interpreter: about 20 s
def test_quick_rows_fire_through_the_command(capsys):
    assert main(["bench", "--quick", "--json", "--dtypes", "float32", "--ops", "moe_route,moe_experts"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["op"], r["mode"], r["shape"]) for r in rows] == [
        ("moe_route", "fwd", [8, 16, 4]), ("moe_route", "fwd+bwd", [8, 16, 4]),
        ("moe_experts", "fwd", [8, 32, 16, 4, 2]), ("moe_experts", "fwd+bwd", [8, 32, 16, 4, 2])]
    assert all(r["fired"] and r["override_ms"] > 0 and r["aten_ms"] > 0 for r in rows)
    assert rows[0]["bytes"] == 8 * (16 * 4 + 4 * (4 + 8))


def test_the_experts_cond_takes_the_qwen3_moe_layer_and_bounds_one_experts_weights():
    """Its int32 bound is on sorted rows times their width and on one expert's weights (expert offsets
    are int64), not on rows times a whole expert's weights, which declined every large layer."""
    from python_native_dsls.triton.ops import moe

    def call(tokens: int, hidden: int, inner: int, experts: int, k: int) -> object:
        one = torch.empty(1, dtype=torch.bfloat16)
        return moe.experts_plan_or_why(
            one.expand(tokens, hidden), torch.zeros(tokens, k, dtype=torch.int64), one.expand(tokens, k),
            one.expand(experts, 2 * inner, hidden), one.expand(experts, hidden, inner))

    assert call(*QWEN3_MOE) == ("silu", False, False, 7.0, 1.702)
    assert "offsets past int32" in call(4, 65536, 16384, 2, 1)  # 2**31 weights in one expert
    assert "offsets past int32" in call(2**19, 4096, 64, 2, 2**10)  # 2**29 sorted rows of 4096


def test_the_calibration_calls_take_qwen3_moes_routing_and_its_layer_scaled_to_the_bucket():
    """x (tokens x hidden) as the router's logits over 128 experts and as the experts' hidden states;
    each call served by the Triton kernels, its first tensor as many elements as x (its size bucket)."""
    from python_native.tools.bench.calibrating import DECLARED, _calibration_args, aten_op, moe_layer

    assert moe_layer(2048) == (768, 128, 8)  # Qwen3-30B-A3B's layer itself
    assert moe_layer(1024) == (384, 64, 4) and moe_layer(8192) == (3072, 8, 2) and moe_layer(64) == (24, 4, 2)
    x = torch.randn(4, 64, device=backend.device_type())
    builders = _calibration_args()
    for symbol in ("moe_route", "moe_route_backward", "moe_experts", "moe_experts_backward"):
        assert symbol in DECLARED
        args = builders[symbol](x, torch.randn_like(x))
        with pn.trace() as t:
            aten_op(symbol)(*args)
        assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == symbol}, symbol
        first = args[0]
        assert first.numel() == (x.numel() // 16 if symbol == "moe_route_backward" else x.numel()), symbol
    route, experts = builders["moe_route"](x, x)[:2], builders["moe_experts"](x, x)
    assert route[0].shape == (2, 128) and route[1] == 8
    assert experts[3].shape == (4, 48, 64) and experts[4].shape == (4, 64, 24) and experts[1].shape == (4, 2)
    assert all(len(set(row)) == 2 for row in experts[1].tolist())  # distinct experts per token


@pytest.mark.slow  # a calibration run through Triton's interpreter: about 15 s, longer on a loaded machine
def test_calibrating_the_moe_rows_writes_verdicts_for_their_four_ops(tmp_path, monkeypatch):
    from python_native.foundations import env
    from python_native.tools.bench import calibrating

    monkeypatch.setattr(calibrating, "calibration_shapes", lambda quick: [(4, 64)])  # one shape: the interpreter
    path = tmp_path / "table.json"
    argv = ["bench", "--calibrate", "--allow-interpreter", "--quick", "--dtypes", "float32", "--ops",
            "moe_route,moe_experts", "--output", str(path)]
    assert main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    if backend.device_type() == "cuda" and not env.unmeasured_allowed():
        assert rows == []  # unmeasured overrides stay out on a GPU until PYTHON_NATIVE_UNMEASURED=1
        return
    assert {r["op"]: r["bucket"] for r in rows} == {
        "moe_route": 9, "moe_route_backward": 5, "moe_experts": 9, "moe_experts_backward": 9}
    assert all(r["dsl"] == "triton" and r["override_ms"] > 0 and r["aten_ms"] > 0 and r["shape"] == [4, 64]
               for r in rows)
