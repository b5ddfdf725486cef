"""A patched model under ``torch.compile``, in both ``pn.compile_mode`` values: one graph (no break
at the patched forwards or the rotary dispatcher), the custom ops kept opaque in it and served by
their overrides at run time, forward and backward, with the eager patched model's results."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
from patch_testing import OURS, aten_overrides_off, inputs, model, serving, step

import python_native as pn


@pytest.fixture
def fresh_compile():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bypass", "keep"])
def test_a_patched_model_compiles_to_one_graph_and_its_ops_reach_their_overrides(mode, fresh_compile):
    m = model("llama", num_hidden_layers=1)
    batch = inputs(m)
    with serving(), aten_overrides_off(), pn.patched(m):
        eager_loss, eager_grads = step(m, batch)
        with pn.compile_mode_set(mode):
            compiled = torch.compile(m, backend="aot_eager", fullgraph=True)  # fullgraph: a break raises
            with pn.trace() as t:
                loss = compiled(**batch).loss
                loss.backward()
    served = {e.op for e in t.events if e.op in OURS and e.outcome == "override"}
    assert served == {"rms_norm", "rms_norm_backward", "swiglu", "swiglu_backward", "rotary", "rotary_backward",
                      "linear_cross_entropy.forward", "linear_cross_entropy.backward"}
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=0)
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_a_patched_model_exports_with_its_ops_in_the_graph_and_the_program_serves_them():
    """``torch.export`` of a patched model: the custom ops stay whole in the exported graph, and
    the exported program computes the eager patched model's loss with them served by overrides."""
    m = model("llama", num_hidden_layers=1)
    batch = inputs(m)
    with serving(), aten_overrides_off(), pn.patched(m):
        with torch.no_grad():
            eager = m(**batch).loss
            program = torch.export.export(m, (), kwargs=batch)
        graph_ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        with torch.no_grad(), pn.trace() as t:
            exported = program.module()(**batch).loss
    assert {"python_native.rms_norm.default", "python_native.swiglu.default", "python_native.rotary.default"} <= \
        graph_ops, sorted(graph_ops)
    assert any(op.startswith("python_native.linear_cross_entropy") for op in graph_ops), sorted(graph_ops)
    served = {e.op for e in t.events if e.op in OURS and e.outcome == "override"}
    assert {"rms_norm", "swiglu", "rotary", "linear_cross_entropy.forward"} <= served, served
    torch.testing.assert_close(exported, eager, rtol=1e-6, atol=0)
