"""pn.compile_mode: overrides inside Inductor-compiled code ("keep") or out of it ("bypass"), and export."""

from __future__ import annotations

import pytest
import torch

import python_native as pn

# isort: split
import python_native_dsls.triton as backend
from python_native.features.compiled import mode as compile_mode

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts

aten = torch.ops.aten


class Recorder:
    """A softmax forward and backward written without aten::_softmax, counting their calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def softmax(self, self_, dim, half_to_float):
        self.calls.append("_softmax")
        shifted = self_ - self_.amax(dim, keepdim=True)
        e = shifted.exp()
        return e / e.sum(dim, keepdim=True)

    def softmax_backward(self, grad_output, output, dim, input_dtype):
        self.calls.append("_softmax_backward_data")
        return output * (grad_output - (grad_output * output).sum(dim, keepdim=True))


@pytest.fixture
def recorder(overrides):
    rec = Recorder()
    overrides("_softmax", None, rec.softmax, unconditional_override=True, priority=10)
    overrides("_softmax_backward_data", None, rec.softmax_backward, unconditional_override=True, priority=10)
    return rec


@pytest.fixture
def fresh_compile():
    """A clean Dynamo cache and no on-disk caches, so each test compiles what it sets up."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()
    pn.compile_mode = "bypass"


class CountingInductor:
    """A torch.compile backend that counts compilations and hands the graph to Inductor."""

    def __init__(self) -> None:
        self.compilations = 0

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.compilations += 1
        return compile_fx(gm, example_inputs)


def scaled_softmax(x):
    return torch.softmax(x * 2, dim=-1) + 1


@pytest.mark.slow
def test_keep_runs_overrides_in_compiled_code_forward_and_backward(recorder, fresh_compile):
    backend = CountingInductor()
    compiled = torch.compile(scaled_softmax, backend=backend, dynamic=True)
    x = torch.randn(4, 8, requires_grad=True)
    with pn.compile_mode_set("keep"):
        assert pn.compile_mode == "keep"
        with pn.trace() as t:
            y = compiled(x)
        assert recorder.calls == ["_softmax"]
        assert any(e.op == "_softmax" and e.outcome == "override" and e.dsl == "testdsl" for e in t.events)
        recorder.calls.clear()
        y.sum().backward()
        assert recorder.calls == ["_softmax_backward_data"]
    assert pn.compile_mode == "bypass"  # the block restored the previous mode
    x_eager = x.detach().clone().requires_grad_(True)
    y_eager = scaled_softmax(x_eager)
    y_eager.sum().backward()
    torch.testing.assert_close(y, y_eager)
    torch.testing.assert_close(x.grad, x_eager.grad)

    # The graph compiled in "keep" keeps routing after the mode changed back; a scope opened
    # after compiling is honoured at run time, without a recompilation.
    recorder.calls.clear()
    other = torch.randn(6, 8, requires_grad=True)  # another size: dynamic=True serves it from the same graph
    with pn.operations_disabled("_softmax"):
        torch.testing.assert_close(compiled(other), scaled_softmax(other))
    assert recorder.calls == []
    compiled(other)
    assert recorder.calls == ["_softmax"]
    assert backend.compilations == 1


def test_bypass_keeps_overrides_out_of_compiled_code_and_in_eager(recorder, fresh_compile):
    assert pn.compile_mode == "bypass"
    backend = CountingInductor()
    compiled = torch.compile(scaled_softmax, backend=backend, fullgraph=True)  # no graph break on routers
    x = torch.randn(4, 8)
    with pn.trace() as t:
        out = compiled(x)
    assert recorder.calls == [] and not [e for e in t.events if e.outcome == "override"]
    assert backend.compilations == 1
    torch.testing.assert_close(out, scaled_softmax(x))
    assert recorder.calls == ["_softmax"]  # eager in the same process still routes


def test_dynamo_sees_one_graph_with_overrides_registered(recorder):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(scaled_softmax)(torch.randn(2, 3))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_export_carries_opaque_ops(recorder):
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1) * 3

    x = torch.randn(3, 5)
    ep = torch.export.export(Model(), (x,))
    assert not _python_native_targets(ep.graph)  # the default export stays pure aten
    only_opaque = pn.decomposition_table({})
    assert only_opaque[aten._softmax.default] is torch.ops.python_native._softmax.default
    assert aten._softmax_backward_data.default in only_opaque and aten.mul.Tensor not in only_opaque
    table = pn.decomposition_table()  # torch's export table too: softmax.int decomposes to _softmax
    decomposed = ep.run_decompositions(table)
    assert _python_native_targets(decomposed.graph) == {"python_native::_softmax"}
    recorder.calls.clear()
    torch.testing.assert_close(decomposed.module()(x), Model()(x))
    assert recorder.calls == ["_softmax", "_softmax"]  # the exported op reached the router, then eager did


def _python_native_targets(graph) -> set[str]:
    return {
        node.target.name() for node in graph.nodes
        if node.op == "call_function" and hasattr(node.target, "name") and node.target.name().startswith("python_native::")
    }


def test_keep_follows_registration_and_restores_inductor_entries(overrides):
    from torch._inductor.decomposition import select_decomp_table

    own = select_decomp_table().get(aten.hardsigmoid.default)
    assert own is not None  # Inductor decomposes hardsigmoid itself
    pn.compile_mode = "keep"
    try:
        handle = overrides("hardsigmoid", None, lambda self: self, unconditional_override=True)
        assert select_decomp_table()[aten.hardsigmoid.default] is torch.ops.python_native.hardsigmoid.default
        assert "aten::hardsigmoid" in compile_mode.describe()["in_compiled_graphs"]
        handle.remove()
        assert select_decomp_table().get(aten.hardsigmoid.default) is own
        overrides("hardsigmoid", None, lambda self: self, unconditional_override=True)
    finally:
        pn.compile_mode = "bypass"
    assert select_decomp_table().get(aten.hardsigmoid.default) is own
    assert compile_mode.describe()["in_compiled_graphs"] == []


@pytest.mark.parametrize("bad", ["inductor", "", None, 1])
def test_invalid_mode_raises_and_changes_nothing(bad):
    with pytest.raises(ValueError, match=r"compile_mode must be one of \['bypass', 'keep'\], got"):
        pn.compile_mode = bad
    with pytest.raises(ValueError, match="got"):
        pn.compile_mode_set(bad)
    assert pn.compile_mode == "bypass"


def test_status_reports_the_mode():
    assert pn.status()["compile"]["mode"] == "bypass"
    with pn.compile_mode_set("keep"):
        data = pn.status()["compile"]
        assert data["mode"] == "keep" and data["modes"] == ["bypass", "keep"]
        assert "aten::_softmax" in data["in_compiled_graphs"]  # the Triton softmax, at whichever key it sits
    assert pn.status()["compile"]["in_compiled_graphs"] == []


def normed(x, weight, bias):
    return torch.nn.functional.layer_norm(x * 2, (x.shape[-1],), weight, bias) + 1


def test_keep_runs_the_triton_layer_norm_forward_and_backward(fresh_compile):
    """The built-in Triton overrides run compiled, on the backend's device (CPU through the interpreter, or a GPU)."""
    if not any(h.dsl == "triton" and h.op == "native_layer_norm_backward" for h in pn.overrides()):
        pytest.skip("the Triton layer_norm overrides are not installed at a key this machine runs")
    if not backend.runtime_available():
        pytest.skip(f"triton backend unavailable: {backend.unavailable_reason()}")
    device = backend.device_type()
    x = torch.randn(4, 16, device=device, requires_grad=True)
    weight = torch.randn(16, device=device, requires_grad=True)
    bias = torch.randn(16, device=device, requires_grad=True)
    pn.compile_mode = "keep"
    compiled = torch.compile(normed)
    with pn.trace() as t:
        out = compiled(x, weight, bias)
        out.sum().backward()
    ops = {e.op for e in t.events if e.outcome == "override" and e.dsl == "triton"}
    assert {"native_layer_norm", "native_layer_norm_backward"} <= ops
    grads = [p.grad for p in (x, weight, bias)]
    eager_inputs = [p.detach().clone().requires_grad_(True) for p in (x, weight, bias)]
    expected = normed(*eager_inputs)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, [p.grad for p in eager_inputs], strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
def test_random_ops_stay_random_in_keep():
    """The twin of a random op carries its randomness tag, so graph passes neither merge nor reorder
    two calls: two dropouts of one input draw two masks."""
    from python_native.features.compiled import opaque

    assert torch.Tag.nondeterministic_seeded in opaque.opaque_op(aten.native_dropout.default).tags
    assert torch.Tag.nondeterministic_seeded not in opaque.opaque_op(aten.bmm.default).tags
    x = torch.randn(32, 32, device=backend.device_type())
    with pn.compile_mode_set("keep"):
        fn = torch.compile(lambda x: (torch.native_dropout(x, 0.5, True)[1], torch.native_dropout(x, 0.5, True)[1]))
        with pn.trace() as t:
            first, second = fn(x)
    torch.compiler.reset()
    assert not torch.equal(first, second)
    installed = "native_dropout" in pn.get_dsl_operations("triton")  # at CUDA: once a table covers it
    assert [e.op for e in t.events if e.outcome == "override"] == ["native_dropout"] * 2 * installed
