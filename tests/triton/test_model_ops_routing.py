"""The model ops through the dispatcher: ``torch.ops.python_native.*`` forward and backward reach
the Triton overrides (``pn.trace`` shows each hit), match the ops' references (the Triton DSL
disabled) and the float64 truth, and answer to their public names in the panel's switches."""

from __future__ import annotations

import pytest
import torch
from triton_testing import assert_routed, compare, make, requires_triton, run, seeded  # noqa: F401

import python_native as pn

pytestmark = [requires_triton, pytest.mark.override]

ops = torch.ops.python_native


def _rotary_both(dim):
    def fn(q, k, cos, sin):
        q_out, k_out = ops.rotary(q, k, cos, sin, dim)
        return torch.cat([q_out.flatten(), k_out.flatten()])
    return fn


def _chunked(fn):
    return lambda gate_up: fn(*gate_up.chunk(2, -1))


CASES = {
    "rms_norm llama": (lambda x, w: ops.rms_norm(x, w, 1e-6), lambda dt: [make(3, 40, dtype=dt), make(40, dtype=dt)]),
    "rms_norm gemma": (lambda x, w: ops.rms_norm(x, w, 1e-6, 1.0, True),
                       lambda dt: [make(2, 3, 4, 16, dtype=dt), make(16, dtype=dt, scale=0.1)]),
    "swiglu chunked": (_chunked(ops.swiglu), lambda dt: [make(3, 2 * 37, dtype=dt)]),
    "geglu": (lambda g, u: ops.geglu(g, u, "tanh"), lambda dt: [make(4, 24, dtype=dt), make(4, 24, dtype=dt)]),
    "rotary": (_rotary_both(1), lambda dt: [make(2, 5, 4, 16, dtype=dt, requires_grad=False).transpose(1, 2).requires_grad_(),
                                            make(2, 5, 2, 16, dtype=dt, requires_grad=False).transpose(1, 2).requires_grad_(),
                                            make(2, 5, 16, dtype=dt, requires_grad=False),
                                            make(2, 5, 16, dtype=dt, requires_grad=False)]),
    "gelu_tanh": (ops.gelu_tanh, lambda dt: [make(3, 50, dtype=dt, scale=3.0)]),
    "quick_gelu": (ops.quick_gelu, lambda dt: [make(3, 50, dtype=dt, scale=3.0)[:, 7:40]]),
}
OPS = {"rms_norm llama": "rms_norm", "rms_norm gemma": "rms_norm", "swiglu chunked": "swiglu", "geglu": "geglu",
       "rotary": "rotary", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_forward_and_backward_reach_the_kernels(case, dtype):
    fn, inputs = CASES[case]
    op = OPS[case]
    compare(fn, inputs(dtype), [op, f"{op}_backward"])


def test_the_chunked_halves_are_never_copied():
    """The gated kernels read the two halves of a fused projection where they lie."""
    from python_native_dsls.triton import testing

    gate, up = make(3, 2 * 37, requires_grad=False).chunk(2, -1)
    launched = []
    with testing.stubbed_launches(lambda launcher, grid, args, warps, constexprs: launched.append(args)):
        ops.swiglu(gate, up)
    assert len(launched) == 1, f"{len(launched)} launches: the override did not run swiglu once"
    args = launched[0]
    assert (args[0].data_ptr(), args[1].data_ptr()) == (gate.data_ptr(), up.data_ptr())


@pytest.mark.parametrize("name", ["rms_norm", "swiglu", "rotary", "quick_gelu"])
def test_public_names_switch_forward_and_backward(name):
    case = {"rms_norm": "rms_norm llama", "swiglu": "swiglu chunked", "rotary": "rotary", "quick_gelu": "quick_gelu"}[name]
    fn, inputs = CASES[case]
    result = run(fn, inputs(torch.float32), scope=pn.operations_disabled(name))
    assert not [e for e in result.triton_events() if e.op in (name, f"{name}_backward")]  # the reference's own ops may hit
    assert result.fell_back(name) and result.fell_back(f"{name}_backward")


def test_declines_are_traced_with_their_reason():
    gate = make(4, 8, dtype=torch.float64)
    with pn.trace() as t:
        ops.swiglu(gate, gate)
    assert_routed(t.events, {"swiglu": "float64"}, "swiglu of float64")
    assert len([e for e in t.events if e.op == "swiglu"]) == 1 and "float64" in t.table()
