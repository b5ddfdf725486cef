"""Custom ops, outside aten (``python_native.foundations.custom_ops``): overrides attach to them like to aten ops.

One op is declared for the whole module (a declaration lasts for the process): ``scaled(x, alpha)``,
``x * alpha`` in plain torch, with a fake kernel and autograd. The test DSL overrides it at the CPU
key; every panel switch, the trace, autograd and torch.compile must treat it as any aten op.
"""

from __future__ import annotations

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL
from python_native.foundations import custom_ops

NAME = "pn_test_scaled"


def _reference(x, alpha):
    return x * alpha


def _fake(x, alpha):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.alpha = inputs[1]


def _backward(ctx, grad):
    return grad * ctx.alpha, None


OP = custom_ops.declare(f"{NAME}(Tensor x, float alpha) -> Tensor", reference=_reference, fake=_fake,
                      backward=_backward, setup_context=_setup, doc="x * alpha")


def _marked(x, alpha):
    """The override: visibly different from the reference (adds 1000), and never calls the op."""
    return x * alpha + 1000


@pytest.fixture
def scaled_override():
    handle = pn.register_op_override(TEST_DSL, "python_native", NAME, "CPU", lambda x, alpha: x.dim() == 1, _marked)
    yield handle
    handle.remove()


def test_an_override_shadows_the_reference_and_every_switch_applies(scaled_override):
    x = torch.ones(3)
    with pn.trace() as trace:
        assert OP(x, 2.0).tolist() == [1002.0] * 3
        assert OP(torch.ones(2, 2), 2.0).tolist() == [[2.0, 2.0]] * 2  # declined by the cond: the reference
    assert [(e.op, e.outcome) for e in trace.events] == [(NAME, "override"), (NAME, "fallback")]
    for scope in (pn.operations_disabled(NAME), pn.operations_disabled(f"python_native::{NAME}"),
                  pn.operations_disabled(OP), getattr(pn, TEST_DSL).disabled(), pn.dispatch_keys_disabled("CPU")):
        with scope:
            assert OP(x, 2.0).tolist() == [2.0] * 3
        assert OP(x, 2.0).tolist() == [1002.0] * 3
    assert f"python_native::{NAME}" in [o["op"] for o in pn.status()["overrides"]]
    assert "testdsl::pn_test_scaled" in pn.router_source(NAME, "CPU", "python_native")
    scaled_override.remove()
    assert OP(x, 2.0).tolist() == [2.0] * 3


def test_autograd_runs_above_the_override(scaled_override):
    x = torch.ones(3, requires_grad=True)
    y = OP(x, 3.0)
    assert y.tolist() == [1003.0] * 3
    y.sum().backward()
    assert x.grad.tolist() == [3.0] * 3


def test_compiled_graphs_keep_the_op_and_reach_the_override(scaled_override):
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: OP(x, 2.0) + 1, backend="aot_eager", fullgraph=True)
    x = torch.ones(3)
    assert compiled(x).tolist() == [1003.0] * 3
    with pn.operations_disabled(NAME):  # decided at run time: no recompilation
        assert compiled(x).tolist() == [3.0] * 3
    torch._dynamo.reset()


def test_the_status_lists_custom_ops():
    ops = {d["op"]: d for d in pn.status()["custom_ops"]}
    assert ops[f"python_native::{NAME}"] == {"op": f"python_native::{NAME}", "kind": "reference", "autograd": True,
                                             "doc": "x * alpha"}
    assert ops["python_native::linear_cross_entropy.forward"]["autograd"]
    assert ops["python_native::linear_cross_entropy"]["kind"] == "composite"


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="aten has an op named 'softmax'"):
        custom_ops.declare("softmax(Tensor x) -> Tensor", reference=_reference, fake=_fake)
    with pytest.raises(ValueError, match="declared already"):
        custom_ops.declare(f"{NAME}(Tensor x, float alpha) -> Tensor", reference=_reference, fake=_fake)
    with pytest.raises(ValueError, match="either reference= .* or composite="):
        custom_ops.declare("pn_test_nothing(Tensor x) -> Tensor")
    with pytest.raises(ValueError, match="needs fake="):
        custom_ops.declare("pn_test_no_fake(Tensor x) -> Tensor", reference=lambda x: x)
    with pytest.raises(ValueError, match="needs both backward= and setup_context="):
        custom_ops.declare("pn_test_half(Tensor x) -> Tensor", reference=lambda x: x, fake=_fake, backward=_backward)
    with pytest.raises(ValueError, match="'name' or 'name.overload'"):
        custom_ops.declare("pn test(Tensor x) -> Tensor", reference=lambda x: x, fake=_fake)
    assert not custom_ops.is_custom_op("pn_test_nothing") and not custom_ops.is_custom_op("pn_test_half")


def test_switch_names_in_other_namespaces_are_still_refused():
    with pytest.raises(ValueError, match="'prims', where no override sits"):
        pn.disable_operations("prims::mul")
