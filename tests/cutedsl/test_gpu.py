"""CuTe DSL ops on a GPU, through the public API: values and gradients against aten.

Every case runs forward and backward with the CuTe DSL overrides (Triton off), then with both
DSLs off; the trace must show the CuTe DSL override serving each op. These need an sm_80+ CUDA
device with cutlass-dsl and TVM-FFI installed, and are skipped elsewhere.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from cutedsl_testing import DTYPES, requires_gpu

import python_native as pn
from python_native.foundations import tolerances

pytestmark = requires_gpu



@pytest.fixture(autouse=True)
def seeded_and_enabled():
    """The CuTe DSL overrides are installed switched off (opt-in): these tests switch them on."""
    torch.manual_seed(0)
    was = pn.cutedsl.enabled
    pn.cutedsl.enable()
    yield
    if not was:
        pn.cutedsl.disable()


def make(*shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    copy = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    return copy.requires_grad_()


def _run(fn, inputs, grad_out, scope):
    leaves = [_leaf(t) for t in inputs]
    with scope, pn.trace() as trace:
        out = fn(*leaves)
        out.backward(grad_out)
    return out.detach(), [None if t is None else t.grad for t in leaves], list(trace.events)


def _close(got, ref, what, grad=False):
    """Within the package's one tolerance table; a gradient is an accumulating result."""
    tol = tolerances.tolerance(got.dtype, tolerances.ACCUMULATING if grad else tolerances.POINTWISE)
    torch.testing.assert_close(got, ref, rtol=tol.rtol, atol=tol.atol_for(ref), equal_nan=True, msg=what)


def compare(fn, inputs, ops):
    probe = fn(*[t for t in inputs])
    grad_out = torch.randn_like(probe, dtype=torch.float32).to(probe.dtype)
    with pn.triton.disabled():
        got = _run(fn, inputs, grad_out, contextlib.nullcontext())
    with pn.triton.disabled(), pn.cutedsl.disabled():
        ref = _run(fn, inputs, grad_out, contextlib.nullcontext())
    _close(got[0], ref[0], "output")
    for i, (g, r) in enumerate(zip(got[1], ref[1], strict=True)):
        if r is not None:
            _close(g, r, f"grad of input {i}", grad=True)
    served = {e.op for e in got[2] if e.dsl == "cutedsl" and e.outcome == "override"}
    missing = set(ops) - served
    assert not missing, f"not served by CuTe DSL: {missing}"
    assert not any(e.dsl == "cutedsl" for e in ref[2])


def test_every_family_is_installed():
    assert set(pn.get_dsl_operations("cutedsl")) >= {
        "_fused_rms_norm", "_fused_rms_norm_backward", "_softmax", "_log_softmax", "_softmax_backward_data",
        "_log_softmax_backward_data", "native_layer_norm", "native_layer_norm_backward",
    }


RMS = ("_fused_rms_norm", "_fused_rms_norm_backward")
LN = ("native_layer_norm", "native_layer_norm_backward")
SOFTMAX = {
    "softmax": (F.softmax, "_softmax", "_softmax_backward_data"),
    "log_softmax": (F.log_softmax, "_log_softmax", "_log_softmax_backward_data"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 33), (2, 5, 128), (64, 300), (3, 5000), (2, 70000)])
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm(shape, dtype, affine):
    n = shape[-1]
    inputs = [make(*shape, dtype=dtype), make(n, dtype=dtype) if affine else None]
    compare(lambda x, w: F.rms_norm(x, [n], w, 1e-6), inputs, RMS)


def test_rms_norm_default_eps_two_dims_and_sliced_rows():
    x = make(6, 4, 40)[:, :, 3:35]  # rows of a wider buffer
    compare(lambda x, w: F.rms_norm(x, [32], w), [x, make(32)], RMS)
    compare(lambda x, w: F.rms_norm(x, [5, 8], w), [make(3, 5, 8), make(5, 8)], RMS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 33), (2, 5, 128), (64, 300), (2, 70000)])
def test_layer_norm_affine(shape, dtype):
    n = shape[-1]
    compare(lambda x, w, b: F.layer_norm(x, [n], w, b, 1e-5), [make(*shape, dtype=dtype), make(n, dtype=dtype),
                                                               make(n, dtype=dtype)], LN)


def test_layer_norm_plain_weight_only_and_sliced():
    compare(lambda x: F.layer_norm(x, [4, 16]), [make(3, 4, 16, dtype=torch.bfloat16)], LN)
    compare(lambda x, w: F.layer_norm(x, [64], w, None), [make(8, 64), make(64)], LN)
    compare(lambda x: F.layer_norm(x, [50]), [make(9, 90)[:, 20:70]], LN)


@pytest.mark.parametrize("kind", SOFTMAX)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((5, 37), -1), ((2, 3, 128), 2), ((64, 300), 1), ((4, 19, 1), 1), ((7,), 0),
                                       ((3, 128256), -1)])
def test_softmax(kind, dtype, shape, dim):
    fn, fwd, bwd = SOFTMAX[kind]
    compare(lambda x: fn(x, dim), [make(*shape, dtype=dtype, scale=3.0)], [fwd, bwd])


@pytest.mark.parametrize("kind", SOFTMAX)
def test_softmax_inf_entries_and_sliced_rows(kind):
    fn, fwd, bwd = SOFTMAX[kind]
    x = make(4, 3000, scale=3.0)
    x[0, :2000] = float("-inf")  # whole threads' shares of the row are -inf
    x[1, ::7] = float("-inf")
    with pn.trace() as trace, pn.triton.disabled():
        out = fn(x, -1)
    assert any(e.dsl == "cutedsl" and e.outcome == "override" for e in trace.events)
    with pn.cutedsl.disabled(), pn.triton.disabled():
        torch.testing.assert_close(out, fn(x, -1))
    compare(lambda x: fn(x, -1), [make(8, 90, scale=3.0)[:, 5:70]], [fwd, bwd])


@pytest.mark.parametrize("log", [False, True])
def test_half_to_float(log):
    op = torch.ops.aten._log_softmax if log else torch.ops.aten._softmax
    x = make(6, 1000, dtype=torch.float16, scale=3.0)
    with pn.trace() as trace, pn.triton.disabled():
        got = op(x, -1, True)
    with pn.cutedsl.disabled(), pn.triton.disabled():
        ref = op(x, -1, True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref)
    assert any(e.dsl == "cutedsl" and e.outcome == "override" for e in trace.events)


REDUCE = {
    "sum": (lambda x: x.sum(-1), "sum.dim_IntList"),
    "mean": (lambda x: x.mean(-1, keepdim=True), "mean.dim"),
    "amax": (lambda x: x.amax(-1), "amax"),
    "amin": (lambda x: torch.amin(x, -1), "amin"),
}


@pytest.mark.parametrize("name", REDUCE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 33), (2, 5, 128), (64, 300), (3, 5000), (2, 128256)])
def test_row_reductions(name, dtype, shape):
    fn, op = REDUCE[name]
    compare(fn, [make(*shape, dtype=dtype, scale=3.0)], [op])
    compare(fn, [make(8, 90, dtype=dtype)[:, 5:70]], [op])  # rows of a wider buffer


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_row_reductions_propagate_nan_like_aten(name):
    fn, op = REDUCE[name]
    x = make(5, 3000)
    x[0, 1234] = float("nan")
    x[1] = float("nan")
    x[2] = float("-inf")
    x[3, ::2] = float("inf")
    with pn.trace() as trace, pn.triton.disabled():
        got = fn(x)
    with pn.cutedsl.disabled(), pn.triton.disabled():
        ref = fn(x)
    assert any(e.op == op and e.dsl == "cutedsl" and e.outcome == "override" for e in trace.events)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


def test_transposed_input_falls_back():
    x = make(64, 48).t()
    with pn.trace() as trace, pn.triton.disabled():
        F.softmax(x, -1)
    assert not any(e.dsl == "cutedsl" and e.outcome == "override" for e in trace.events)


def test_second_process_loads_from_the_disk_cache(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import torch, torch.nn.functional as F, python_native as pn\n"
        "from python_native_dsls.cutedsl.kernels import compiler\n"
        "x = torch.randn(4, 256, device='cuda')\n"
        "with pn.triton.disabled():\n"
        "    F.softmax(x, -1)\n"
        "torch.cuda.synchronize()\n"
        "print(len(compiler._functions))\n"
    )
    env = {**os.environ, "PYTHON_NATIVE_CACHE_DIR": str(tmp_path), "PYTHON_NATIVE_CUTEDSL": "1"}
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".bin"]) == 1
