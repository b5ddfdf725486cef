"""``pn.explain``: the chain a call goes through, read from the live registry without running the op.

Each case checks the explanation against what a real call of the same arguments does, read from a
trace: the override ``explain`` names is the one that ran, the reason it gives is the trace's.
"""

from __future__ import annotations

import pytest
import torch

import python_native as pn  # first: importing python_native_dsls.triton before python_native skips its registration

# isort: split
import python_native_dsls.triton as backend

pytestmark = pytest.mark.skipif(not backend.runtime_available(),
                                reason=f"triton backend unavailable: {backend.unavailable_reason()}")
KEY = backend.dispatch_key()


def traced_softmax(x: torch.Tensor) -> list:
    with pn.trace() as t:
        torch.softmax(x, -1)
    return [e for e in t.events if e.op == "_softmax"]


def triton_step(explanation: pn.Explanation):
    found = [s for s in explanation.steps if s.name.startswith("triton::")]
    assert len(found) == 1, explanation
    return found[0]


@pytest.mark.override
def test_an_accepted_call_names_the_override_and_its_kernel_function():
    x = torch.randn(4, 64, device=backend.device_type())
    found = pn.explain("_softmax", x, -1, False)
    step = triton_step(found)
    assert step.active and step.accepts and step.reason is None
    assert step.cond_layers[-1] == "own: python_native_dsls.triton.ops.softmax:_softmax_cond"
    assert step.kernel == "python_native_dsls.triton.ops.softmax:softmax_impl"
    assert found.override == step.name and found.runs.startswith(step.name)
    assert found.router_source == pn.router_source("_softmax", KEY)
    text = str(found)
    assert f"aten::_softmax at {KEY}" in text and "front: " in text and "replay: " in text
    assert "_pn_router" in text and "-> accepts" in text
    events = traced_softmax(x)  # what the call does agrees
    assert events and {(e.dsl, e.outcome, e.override) for e in events} == {("triton", "override", step.name)}


@pytest.mark.override
def test_a_declined_call_gives_the_reason_the_trace_gives():
    x = torch.randn(4, 64, dtype=torch.float64, device=backend.device_type())
    found = pn.explain(torch.ops.aten._softmax.default, x, -1, False)
    step = triton_step(found)
    assert step.accepts is False and "dtype float64" in step.reason
    assert found.override is None and found.runs.startswith("aten's kernel") and step.reason in found.runs
    events = traced_softmax(x)
    assert events and all(e.outcome == "fallback" and step.reason in e.reason for e in events)


@pytest.mark.override
def test_a_disabled_dsl_is_inactive_and_aten_runs():
    x = torch.randn(4, 64, device=backend.device_type())
    with pn.flags(triton=False):
        found = pn.explain("aten::_softmax", x, -1, False)
        events = traced_softmax(x)
    step = triton_step(found)
    assert not step.active and step.accepts is None and step.off == "DSL triton disabled by a scope"
    assert found.override is None and "DSL triton disabled by a scope" in found.runs
    assert events and all(e.outcome == "fallback" and "DSL triton disabled" in e.reason for e in events)
    assert pn.explain("_softmax", x, -1, False).override == step.name  # the scope is over


def plain_softmax(self, dim, half_to_float):
    e = (self - self.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)


@pytest.mark.override
def test_checked_mode_shows_as_an_impl_layer(overrides, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")  # read at registration
    handle = overrides("_softmax", lambda self, dim, half_to_float: self.dtype == torch.float32, plain_softmax,
                       key=KEY, priority=100)
    x = torch.randn(4, 64, device=backend.device_type())
    found = pn.explain("_softmax", x, -1, False)
    step = found.steps[0]
    assert step.name == handle.name, found
    assert step.impl_layers[0].startswith("checked mode: ") and step.impl_layers[-1].endswith(":plain_softmax")
    assert step.kernel.endswith("test_explain:plain_softmax")
    assert found.override == handle.name  # first by priority
    assert triton_step(found).accepts is None  # never reached: the first override takes the call
    events = traced_softmax(x)
    assert events and {(e.outcome, e.override) for e in events} == {("override", handle.name)}


def test_explain_runs_nothing():
    x = torch.randn(4, 64, device=backend.device_type())
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Watch():
        pn.explain("_softmax", x, -1, False)
    assert torch.ops.aten._softmax.default not in seen


@pytest.mark.parametrize("op,args,error,words", [
    ("no_such_op", (torch.ones(2),), ValueError, "'no_such_op' names no operator"),
    (42, (torch.ones(2),), TypeError, "got int: 42"),
    ("_softmax", (2, -1, False), ValueError, "hold no tensor"),
    ("_softmax", (torch.ones(2), -1, False, "extra"), TypeError, "do not fit"),
])
def test_bad_input_says_what_is_allowed(op, args, error, words):
    with pytest.raises(error, match=words):
        pn.explain(op, *args)


def test_an_op_without_overrides_runs_aten():
    found = pn.explain("aten::cos", torch.ones(3))
    assert found.router_source is None and found.steps == () and found.override is None
    assert found.runs.startswith("aten's kernel: no override")
