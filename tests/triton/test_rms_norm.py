"""RMS norm: ``_fused_rms_norm`` and ``_fused_rms_norm_backward``.

``F.rms_norm`` reaches ``_fused_rms_norm`` on every device. Where the backend key has kernels
for both ops (CUDA builds) the overrides are installed and tested through ``F.rms_norm``. A CPU
build has no CPU kernel for ``_fused_rms_norm_backward``, so in interpreter mode the family is
not installed; the kernels are then tested by calling the cond/impl pairs directly, and the
autograd path by installing them at the CPU key with ``torch.library`` for one test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_testing import (  # noqa: F401
    DEVICE,
    DTYPES,
    KEY,
    assert_matches,
    compare,
    lower_register_max,
    make,
    requires_triton,
    seeded,
)

import python_native as pn
from python_native_dsls.triton.ops import rms_norm as rms

pytestmark = requires_triton

FWD, BWD = "_fused_rms_norm", "_fused_rms_norm_backward"
INSTALLED = FWD in pn.get_dsl_operations("triton")
SHAPES = [(4, 33), (2, 5, 128), (64, 300)]


def _reference(x, w, normalized_shape, eps, dy):
    """aten's forward and, by autograd through ``F.rms_norm``, its gradients."""
    x = x.detach().clone().requires_grad_()
    w = None if w is None else w.detach().clone().requires_grad_()
    with pn.triton.disabled():
        out, rstd = torch.ops.aten._fused_rms_norm(x.detach(), normalized_shape, w, eps)
        y = F.rms_norm(x, normalized_shape, w, eps)
        y.backward(dy)
    return out, rstd, x.grad, None if w is None else w.grad


def test_installed_exactly_where_the_backend_has_both_kernels():
    has = all(torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{op}", KEY) for op in (FWD, BWD))
    assert INSTALLED == has
    assert (BWD in pn.get_dsl_operations("triton")) == has


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_kernels_match_aten(shape, dtype, affine):
    n = shape[-1]
    x = make(*shape, dtype=dtype, requires_grad=False)
    w = make(n, dtype=dtype, requires_grad=False) if affine else None
    dy = make(*shape, dtype=dtype, requires_grad=False)
    eps = 1e-6
    assert rms.FAMILY["_fused_rms_norm"].cond(x, [n], w, eps)
    out, rstd = rms.rms_norm_impl(x, [n], w, eps)
    ref_out, ref_rstd, ref_dx, ref_dw = _reference(x, w, [n], eps, dy)
    assert rstd.shape == ref_rstd.shape and rstd.dtype == ref_rstd.dtype == torch.float32
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(rstd, ref_rstd)

    mask = [True, affine]
    assert rms.FAMILY["_fused_rms_norm_backward"].cond(dy, x, [n], rstd, w, mask)
    dx, dw = rms.rms_norm_backward_impl(dy, x, [n], rstd, w, mask)
    wide = _reference(x.double(), None if w is None else w.double(), [n], eps, dy.double())
    assert_matches(dx, ref_dx, wide[2], "dx", grad=True)
    if affine:
        assert_matches(dw, ref_dw, wide[3], "dw", grad=True)
    else:
        assert dw is None


def test_default_eps_and_two_normalized_dims():
    x, w = make(3, 4, 40, requires_grad=False), make(4, 40, requires_grad=False)
    out, rstd = rms.rms_norm_impl(x, [4, 40], w, None)
    ref_out, ref_rstd, _, _ = _reference(x, w, [4, 40], None, torch.zeros_like(x))
    assert rstd.shape == (3, 1, 1)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(rstd, ref_rstd)


def test_conds_decline_what_the_kernels_do_not_handle():
    x, w = make(4, 32, requires_grad=False), make(32, requires_grad=False)
    assert rms.FAMILY["_fused_rms_norm"].cond(x, [32], w, 1e-6)
    assert not rms.FAMILY["_fused_rms_norm"].cond(x.double(), [32], w.double(), 1e-6)
    assert not rms.FAMILY["_fused_rms_norm"].cond(x.half(), [32], w, 1e-6)  # mixed dtypes
    assert not rms.FAMILY["_fused_rms_norm"].cond(x, [16], None, 1e-6)  # shape does not end with normalized_shape
    assert not rms.FAMILY["_fused_rms_norm"].cond(make(3, 4, 32, requires_grad=False).transpose(0, 1), [32], w, 1e-6)
    assert not rms.FAMILY["_fused_rms_norm"].cond(x[:0], [32], w, 1e-6)  # empty
    rstd = torch.ones(4, 1, device=x.device)
    assert not rms.FAMILY["_fused_rms_norm_backward"].cond(x, x, [32], rstd, None, [True, True])  # no weight to grad
    assert not rms.FAMILY["_fused_rms_norm_backward"].cond(x.half(), x, [32], rstd, w, [True, True])


@pytest.mark.skipif(not INSTALLED, reason="the backend key lacks a _fused_rms_norm_backward kernel")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.override
def test_public_api_uses_the_overrides(dtype):
    x, w = make(6, 96, dtype=dtype), make(96, dtype=dtype)
    compare(lambda x, w: F.rms_norm(x, (96,), w, 1e-6), [x, w], [FWD, BWD])


@pytest.fixture
def cpu_rms_kernels():
    """Install the impls at the CPU key for one test (CPU builds, where python-native cannot)."""
    calls: list[str] = []

    def forward(*args):
        assert rms.FAMILY["_fused_rms_norm"].cond(*args)
        calls.append(FWD)
        return rms.rms_norm_impl(*args)

    def backward(*args):
        assert rms.FAMILY["_fused_rms_norm_backward"].cond(*args)
        calls.append(BWD)
        return rms.rms_norm_backward_impl(*args)

    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl(FWD, forward, "CPU")
        lib.impl(BWD, backward, "CPU")
        yield calls
    finally:
        lib._destroy()


@pytest.mark.skipif(INSTALLED or DEVICE != "cpu", reason="only CPU builds route F.rms_norm this way")
def test_f_rms_norm_reaches_cpu_kernels_through_autograd(cpu_rms_kernels):
    x, w = make(5, 48), make(48)
    dy = make(5, 48, requires_grad=False)
    y = F.rms_norm(x, (48,), w, 1e-6)
    y.backward(dy)
    assert cpu_rms_kernels == [FWD, BWD]
    # The formula spelled out in float64 (F.rms_norm itself would reach the kernels again).
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    ref.backward(dy.double())
    torch.testing.assert_close(y, ref.float())
    torch.testing.assert_close(x.grad, x64.grad.float())
    torch.testing.assert_close(w.grad, w64.grad.float())


def _check_backward(x, w, dy, n, eps=1e-6):
    """The backward impl against aten's gradients (forward statistics from aten)."""
    with pn.triton.disabled():
        _, rstd = torch.ops.aten._fused_rms_norm(x, [n], w, eps)
    ref_out, ref_rstd, ref_dx, ref_dw = _reference(x, w, [n], eps, dy)
    mask = [True, w is not None]
    assert rms.FAMILY["_fused_rms_norm_backward"].cond(dy, x, [n], rstd, w, mask)
    dx, dw = rms.rms_norm_backward_impl(dy, x, [n], rstd, w, mask)
    wide = _reference(x.double(), None if w is None else w.double(), [n], eps, dy.double())
    assert_matches(dx, ref_dx, wide[2], "dx", grad=True)
    if w is not None:
        assert_matches(dw, ref_dw, wide[3], "dw", grad=True)


@pytest.mark.parametrize("n,dtype", [(20000, torch.float32), (20000, torch.bfloat16), (30001, torch.float16)])
def test_backward_streams_rows_wider_than_a_register_tile(n, dtype):
    x, w, dy = (make(*s, dtype=dtype, requires_grad=False) for s in ((2, n), (n,), (2, n)))
    _check_backward(x, w, dy, n)


@pytest.mark.parametrize("register_max", [16384, 64])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_backward_folds_weight_gradients_from_several_programs(register_max, dtype, affine, monkeypatch):
    """Enough rows for several persistent programs with uneven row blocks, odd widths, on the
    register path and (limit lowered) the streamed path."""
    paths = lower_register_max(monkeypatch, register_max)
    x, dy = make(97, 201, dtype=dtype, requires_grad=False), make(97, 201, dtype=dtype, requires_grad=False)
    _check_backward(x, make(201, dtype=dtype, requires_grad=False) if affine else None, dy, 201)
    assert set(paths) == {"rows" if register_max >= 201 else "columns"}


@pytest.mark.parametrize("register_max", [16384, 64])
def test_backward_of_strided_rows(register_max, monkeypatch):
    paths = lower_register_max(monkeypatch, register_max)
    x = make(30, 400, requires_grad=False)[:, 7:140]  # row stride 400
    dy = make(133, 30, requires_grad=False).t()  # column stride 30
    _check_backward(x, make(133, requires_grad=False), dy, 133)
    assert set(paths) == {"rows" if register_max >= 133 else "columns"}
