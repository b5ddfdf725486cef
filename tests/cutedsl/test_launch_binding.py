"""Each impl compiles (or loads) its specialization and calls it with the arguments the program expects.

Without a GPU the call stops at TVM-FFI's argument check: it names the first tensor's device
(``expected device_type=cuda``) only once the argument count matched the compiled signature, so
these tests pin the binding of every impl. The kernels' results are checked in ``test_gpu``.
"""

from __future__ import annotations

import pytest
import torch
from cutedsl_testing import requires_cutlass

from python_native_dsls.cutedsl.ops import layer_norm, rms_norm, softmax

pytestmark = requires_cutlass


@pytest.fixture(autouse=True)
def offline_target(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("PYTHON_NATIVE_CACHE_DIR", str(tmp_path))
    for module in (rms_norm, layer_norm):
        monkeypatch.setattr(module, "backward_ctas", lambda t, n_rows: min(n_rows, 4))


def x16(*shape):
    return torch.randn(*shape, dtype=torch.float16)


CALLS = {
    "rms_norm": lambda: rms_norm.rms_norm_impl(x16(4, 64), [64], x16(64), None),
    "rms_norm_plain": lambda: rms_norm.rms_norm_impl(x16(4, 64), [64], None, 1e-6),
    "rms_norm_unvectorized": lambda: rms_norm.rms_norm_impl(x16(4, 33), [33], x16(33), None),
    "softmax_unvectorized": lambda: softmax.log_softmax_impl(x16(4, 72)[:, 1:65], -1, False),
    "rms_norm_backward": lambda: rms_norm.rms_norm_backward_impl(
        x16(4, 64), x16(4, 64), [64], torch.ones(4, 1), x16(64), [True, True]
    ),
    "layer_norm": lambda: layer_norm.layer_norm_impl(x16(4, 64), [64], x16(64), x16(64), 1e-5),
    "layer_norm_backward": lambda: layer_norm.layer_norm_backward_impl(
        x16(4, 64), x16(4, 64), [64], torch.zeros(4, 1), torch.ones(4, 1), x16(64), None, [True, True, False]
    ),
    "softmax": lambda: softmax.softmax_impl(x16(4, 64), -1, True),
    "log_softmax_backward": lambda: softmax.log_softmax_backward_impl(
        torch.randn(4, 64), torch.randn(4, 64), -1, torch.float16
    ),
}


@pytest.mark.parametrize("name", CALLS)
def test_impl_binds_the_compiled_signature(name):
    with pytest.raises(ValueError, match=r"argument #0 .*expected device_type=cuda"):
        CALLS[name]()


def test_vector_flags_need_whole_aligned_chunks():
    from python_native_dsls.cutedsl.ops._rows import as_rows, vector_flags

    x = x16(4, 64)
    assert vector_flags(as_rows(x, 1), x, x16(64)) == ("vec",)
    assert vector_flags(as_rows(x16(4, 33), 1), x16(4, 33)) == ()  # rows not a multiple of 8 halves
    shifted = x16(4, 72)[:, 1:65]  # base 2 bytes past alignment
    assert vector_flags(as_rows(shifted, 1), shifted) == ()
    wide = x16(4, 68)[:, :64]  # row stride of 68 halves: rows after the first are misaligned
    assert vector_flags(as_rows(wide, 1), wide) == ()
    assert vector_flags(as_rows(x16(1, 64), 1), x16(1, 64)) == ("vec",)


def test_programs_load_once_per_specialization():
    from python_native_dsls.cutedsl.kernels import compiler
    from python_native_dsls.cutedsl.ops import _rows

    first = _rows.launcher("softmax_forward", torch.float32, torch.float32, 100, torch.empty(1), "log")
    loaded = len(compiler._functions)
    again = _rows.launcher("softmax_forward", torch.float32, torch.float32, 900, torch.empty(1), "log")
    assert again is first and len(compiler._functions) == loaded  # same size class: same program
    other = _rows.launcher("softmax_forward", torch.float32, torch.float32, 5000, torch.empty(1), "log")
    assert other is not first and len(compiler._functions) == loaded + 1
