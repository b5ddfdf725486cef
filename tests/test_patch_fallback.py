"""A patched model never runs a custom op that no override serves: where none is active at the
input's dispatch key (the DSLs switched off, or no kernel installed there), each patched forward
runs the module's own code, bit for bit the unpatched model and with no custom-op call, and an open
trace says why; where one is active the overrides serve as before, switches followed call by call.
Under ``torch.compile`` the patched model with nothing served compiles to the unpatched model's
graphs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
import python_native as pn
import python_native_dsls.triton as triton_backend
from conftest import TEST_DSL
from python_native.core.registry import REGISTRY
from python_native.patching import runtime
from python_native.tools import tiny_models

OURS = ("rms_norm", "swiglu", "rotary", "linear_cross_entropy")
DEVICE, KEY = triton_backend.device_type(), triton_backend.dispatch_key()  # where the Triton kernels serve


def _llama(**overrides) -> torch.nn.Module:
    """A tiny Llama in training mode (where the fused loss serves), on the Triton kernels' device;
    it has no dropout."""
    return tiny_models.build("llama", **overrides).train().to(DEVICE)


def _installed(*ops: str) -> None:
    """Skip unless an override of each custom op sits at the kernels' key (at the CUDA key the
    unmeasured ones install only with ``PYTHON_NATIVE_UNMEASURED=1``)."""
    missing = [op for op in ops if not (slot := REGISTRY.slots.get(("python_native", op, KEY))) or not slot.overrides]
    if missing:
        pytest.skip(f"no override of {', '.join(missing)} is installed at {KEY} here")


def _step(m: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m.zero_grad(set_to_none=True)
    loss = m(**batch).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _ours(trace) -> list:
    return [e for e in trace.events if e.op.startswith(OURS)]


def _nothing_served():
    """Every DSL that can serve a custom op at the CPU key here, held off."""
    return pn.triton.disabled(), getattr(pn, TEST_DSL).disabled()


def test_with_the_dsls_off_a_patched_step_is_the_unpatched_step_and_the_trace_says_no_override():
    _installed("rms_norm", "swiglu", "rotary", "linear_cross_entropy.forward")
    m = _llama()
    m.set_attn_implementation("eager")  # SDPA's memory-efficient backward on CUDA adds in no fixed order
    batch = tiny_models.example_inputs(m, batch=2, seq=16)
    triton_off, test_off = _nothing_served()
    with triton_off, test_off, pn.benchmark_set(False):  # no first-use timing on a GPU: the same kernels each step
        loss, grads = _step(m, batch)
        with pn.patched(m) as report, pn.trace() as t:
            patched_loss, patched_grads = _step(m, batch)
    assert {e.rule for e in report.patched} == {"rms_norm", "gated_mlp", "rotary", "causal_lm_loss"}
    assert report.own_code == report.patched  # the report said so when patching
    assert all(e.serves.startswith(f"its own code at {KEY}: no override of python_native::") and "disabled" in e.serves
               for e in report.patched), report
    assert "served by:" in str(report)
    assert torch.equal(patched_loss, loss)
    assert all(torch.equal(patched_grads[n], g) for n, g in grads.items())  # bit for bit
    events = _ours(t)
    # Only the patched forwards spoke (a custom op's router, reached, would record its own event):
    # no custom op ran, forward or backward.
    assert events and all(e.outcome == "fallback" and e.reason.startswith("patch: no override") for e in events)
    assert {(e.op, e.module) for e in events} >= {("rms_norm", "model.layers.0.input_layernorm"),
                                                   ("swiglu", "model.layers.1.mlp"),
                                                   ("rotary", "model.layers.0.self_attn"),
                                                   ("linear_cross_entropy.forward", "LlamaForCausalLM")}
    assert all("disabled" in e.reason for e in events)  # which switch keeps each override out


def test_the_check_follows_the_switches_call_by_call():
    """No cache outlives a switch: the same patched norm falls back inside the scope and is served
    by an override outside it, both ways round."""
    _installed("rms_norm")
    norm = _llama(num_hidden_layers=1).model.norm
    x = torch.randn(2, 5, norm.weight.shape[0], device=DEVICE)
    want = norm(x)
    with pn.benchmark_set(False), pn.patched(norm):  # untimed on a GPU: the override serves
        with pn.operations_disabled("rms_norm"), pn.trace() as off:
            a = norm(x)
        with pn.trace() as on:
            b = norm(x)
    assert torch.equal(a, want)
    torch.testing.assert_close(b, want, rtol=1e-5, atol=1e-6)
    assert [(e.op, e.outcome, e.module) for e in _ours(off)] == [("rms_norm", "fallback", "LlamaRMSNorm")]
    assert "op rms_norm disabled by a scope" in _ours(off)[0].reason
    assert [(e.op, e.outcome) for e in _ours(on)] == [("rms_norm", "override")]


def test_the_report_says_which_dsl_serves_each_routed_entry():
    _installed("rms_norm", "swiglu", "rotary", "linear_cross_entropy.forward")
    m = _llama(num_hidden_layers=1)
    with pn.benchmark_set(False), pn.patched(m) as report:  # untimed on a GPU: the report names no timing
        pass
    assert not report.own_code and "served by:" not in str(report)
    ops = {"rms_norm": "rms_norm", "gated_mlp": "swiglu", "rotary": "rotary",
           "causal_lm_loss": "linear_cross_entropy.forward"}
    for entry in report.patched:
        assert entry.serves.endswith(f"override of python_native::{ops[entry.rule]} at {KEY}"), entry
        assert report.to_dict()["entries"][report.entries.index(entry)]["serves"] == entry.serves


def test_a_device_without_an_override_runs_the_modules_own_code():
    """On the meta device no custom op has an override: the module's own forward runs there."""
    norm = _llama(num_hidden_layers=1).model.norm
    with pn.patched(norm):
        norm.to("meta")
        with pn.trace() as t:
            out = norm(torch.empty(2, 3, norm.weight.shape[0], device="meta"))
    assert out.device.type == "meta"
    (event,) = _ours(t)
    assert event.reason == ("patch: no override of python_native::rms_norm is installed at META: "
                            "the module's own forward ran")


def test_the_ops_each_rule_waits_for_are_its_custom_ops_forward_first():
    assert runtime.custom_ops_of(("rms_norm",)) == ("rms_norm", "rms_norm_backward")
    assert runtime.custom_ops_of(("linear_cross_entropy",))[0] == "linear_cross_entropy.forward"
    assert set(runtime.custom_ops_of(("linear_cross_entropy",))) == {"linear_cross_entropy.forward",
                                                                    "linear_cross_entropy.backward"}
    assert runtime.custom_ops_of(("not_an_op",)) == ()


_WITHOUT_INTERPRETER = textwrap.dedent("""
    import torch
    import python_native as pn
    from python_native.tools import tiny_models

    m = tiny_models.build("llama").train()
    batch = tiny_models.example_inputs(m, batch=2, seq=16)

    def step():
        m.zero_grad(set_to_none=True)
        loss = m(**batch).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in m.parameters()]

    loss, grads = step()
    print(pn.patch(m))
    with pn.trace() as t:
        patched_loss, patched_grads = step()
    assert torch.equal(loss, patched_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, patched_grads))
    reasons = {(e.op, e.reason) for e in t.events}
    print(sorted(reasons))
""")


def test_on_cpu_without_the_interpreter_a_patched_step_is_the_unpatched_step():
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "0", "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _WITHOUT_INTERPRETER], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for op in ("rms_norm", "swiglu", "rotary", "linear_cross_entropy.forward"):
        assert (f"no override of python_native::{op} is installed at CPU: the "
                f"{'function' if op == 'rotary' else 'module'}") in proc.stdout, proc.stdout
        assert f"its own code at CPU: no override of python_native::{op} is installed at CPU\n" in proc.stdout


def _calls(graphs: list) -> list[str]:
    return [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]


@pytest.mark.slow
def test_compiled_with_nothing_served_it_is_the_compiled_unpatched_model_until_an_override_serves():
    """Dynamo traces the modules' own code where no override serves (same graphs, no custom op in
    them) and guards on it: once the overrides serve again, the next call recompiles to the ops."""
    graphs: list = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    m = _llama(num_hidden_layers=1)
    batch = tiny_models.example_inputs(m, batch=2, seq=16)
    torch._dynamo.reset()
    try:
        triton_off, test_off = _nothing_served()
        with triton_off, test_off:
            torch.compile(m, backend=recording)(**batch).loss.backward()
            unpatched, graphs[:] = list(graphs), []
            torch._dynamo.reset()
            pn.patch(m)
            compiled = torch.compile(m, backend=recording)
            compiled(**batch).loss.backward()
            patched = list(graphs)
        assert len(patched) == len(unpatched) == 1
        assert _calls(patched) == _calls(unpatched)
        assert not [c for c in _calls(patched) if "python_native" in c]
        compiled(**batch).loss.backward()  # the overrides serve again: a recompilation routes to them
        assert {"python_native.rms_norm.default", "python_native.swiglu.default",
                "python_native.rotary.default"} <= set(_calls(graphs[len(patched):]))
    finally:
        pn.unpatch(m)
        torch._dynamo.reset()


@pytest.fixture
def fake_gpu(calib, monkeypatch):
    """The CPU key's overrides serve a fake GPU (CPU tensors report its device key), timed by a fake
    clock; ``pn.benchmark`` as a fresh process has it (not set); what ``pn.patch`` asks for is dropped after."""
    from first_use_testing import NOT_AT_CPU, TRITON_AT_CPU, patching_on_a_fake_gpu

    if not TRITON_AT_CPU:
        pytest.skip(NOT_AT_CPU)
    with patching_on_a_fake_gpu(calib, monkeypatch) as clock:
        yield clock


@pytest.mark.parametrize(("timings", "outcome"), [((1.0, 2.0), "override"), ((2.0, 1.0), "fallback")])
def test_patching_on_a_gpu_times_each_op_on_first_use_and_the_faster_serves(fake_gpu, timings, outcome):
    fake_gpu.timings = lambda numel: timings  # (override ms, reference ms)
    assert pn.benchmark is False  # nobody asked for measuring: pn.patch does, for its ops
    norm = _llama(num_hidden_layers=1).model.norm
    x = torch.randn(2, 5, norm.weight.shape[0])
    with pn.patched(norm) as report:
        assert "timed on its first call" in report.patched[0].serves
        with pn.trace() as first:
            norm(x)
        with pn.trace() as again:
            norm(x)
    assert fake_gpu.asked == [tuple(x.shape)]  # measured once, on the first call of its size
    assert [(e.op, e.outcome) for e in _ours(first)] == [("rms_norm", outcome)]
    assert [(e.op, e.outcome) for e in _ours(again)] == [("rms_norm", outcome)]  # the verdict is kept


def test_pn_benchmark_set_to_false_keeps_patching_from_measuring(fake_gpu):
    pn.benchmark = False
    norm = _llama(num_hidden_layers=1).model.norm
    with pn.patched(norm) as report:
        norm(torch.randn(2, 5, norm.weight.shape[0]))
    assert fake_gpu.asked == []
    assert "timed" not in report.patched[0].serves
