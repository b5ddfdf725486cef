"""Every cond answers from metadata alone: the same verdict on FakeTensors as on real tensors,
and quickly enough to sit in front of every call."""

from __future__ import annotations

import time

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from triton_testing import DEVICE, requires_triton

from python_native_dsls.triton.ops import (
    activations,
    bmm,
    gated,
    layer_norm,
    model_activations,
    model_rms_norm,
    rms_norm,
    rotary,
    softmax,
)

pytestmark = requires_triton


def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _stats(n_rows: int) -> torch.Tensor:
    return torch.ones(n_rows, 1, device=DEVICE)


# (cond, args, kwargs, expected verdict)
CASES = [
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(4, 32), [32], t(32), t(32), 1e-5), {}, True),
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(4, 32), [32], None, None, 1e-5), {}, True),
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(4, 32, dtype=torch.float64), [32], None, None, 1e-5), {}, False),
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(4, 32), [32], t(32, dtype=torch.float16), None, 1e-5), {}, False),
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(4, 40000), [40000], None, None, 1e-5), {}, False),  # too long a row
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(0, 32), [32], None, None, 1e-5), {}, False),
    (layer_norm.FAMILY["native_layer_norm"].cond, (t(2, 10000), [10000], None, None, 1e-5), {}, True),
    (  # the backward streams rows wider than the forward's limit
        layer_norm.FAMILY["native_layer_norm_backward"].cond,
        (t(2, 40000), t(2, 40000), [40000], _stats(2), _stats(2), None, None, [True, False, False]),
        {},
        True,
    ),
    (
        layer_norm.FAMILY["native_layer_norm_backward"].cond,
        (t(4, 32), t(4, 32), [32], _stats(4), _stats(4), t(32), t(32), [True, True, True]),
        {},
        True,
    ),
    (
        layer_norm.FAMILY["native_layer_norm_backward"].cond,
        (t(4, 32), t(4, 32), [32], _stats(4), _stats(4), None, None, [True, True, False]),
        {},
        False,
    ),
    (rms_norm.FAMILY["_fused_rms_norm"].cond, (t(4, 32), [32], t(32), None), {}, True),
    (rms_norm.FAMILY["_fused_rms_norm_backward"].cond, (t(4, 32), t(4, 32), [32], _stats(4), t(32), [True, True]), {}, True),
    (softmax.FAMILY["_softmax"].cond, (t(4, 32), -1, False), {}, True),
    (softmax.FAMILY["_softmax"].cond, (t(4, 32), 0, False), {}, False),
    (softmax.FAMILY["_softmax"].cond, (t(4, 100000), 1, False), {}, True),  # long rows stream
    (softmax.FAMILY["_softmax"].cond, (t(4, 32, dtype=torch.float16), 1, True), {}, DEVICE == "cuda"),
    (softmax.FAMILY["_softmax_backward_data"].cond, (t(4, 32), t(4, 32), 1, torch.float32), {}, True),
    (softmax.FAMILY["_softmax_backward_data"].cond, (t(4, 32), t(4, 32), 1, torch.float16), {}, DEVICE == "cuda"),
    (softmax.FAMILY["_softmax_backward_data"].cond, (t(4, 32, dtype=torch.float16), t(4, 32), 1, torch.float32), {}, False),
    (activations.FAMILY["silu"].cond, (t(3, 5),), {}, True),
    (activations.FAMILY["silu"].cond, (t(3, 10)[:, ::2],), {}, False),
    (activations.FAMILY["silu"].cond, (t(3, 10)[:, :5],), {}, True),  # a row view: rows at a stride, the last dim contiguous
    (activations.FAMILY["silu_backward"].cond, (t(3, 5), t(3, 5)), {}, True),
    (activations.FAMILY["silu_backward"].cond, (t(5, 3).t(), t(3, 5)), {}, False),  # layouts differ
    (activations.FAMILY["gelu"].cond, (t(3, 5),), {"approximate": "tanh"}, True),
    (activations.FAMILY["gelu"].cond, (t(3, 5),), {"approximate": "bogus"}, False),
    (activations.FAMILY["gelu_backward"].cond, (t(3, 5), t(3, 5)), {"approximate": "none"}, True),
    (bmm.FAMILY["bmm"].cond, (t(2, 3, 1), t(2, 1, 4)), {}, True),
    (bmm.FAMILY["bmm"].cond, (t(2, 3, 2), t(2, 2, 4)), {}, False),
    (bmm.FAMILY["bmm"].cond, (t(2, 3, 1), t(3, 1, 4)), {}, False),
    # the declared model ops
    (model_rms_norm.FAMILY["rms_norm"].cond, (t(2, 3, 32), t(32), 1e-6, 1.0, True), {}, True),
    (model_rms_norm.FAMILY["rms_norm"].cond, (t(4, 32, dtype=torch.bfloat16), t(32), 1e-6, 0.0, False), {}, True),
    (model_rms_norm.FAMILY["rms_norm"].cond, (t(4, 32), t(16), 1e-6, 0.0, False), {}, False),
    (model_rms_norm.FAMILY["rms_norm_backward"].cond, (t(4, 32), t(4, 32), t(32), 1e-6, 0.0, False), {}, True),
    (gated.FAMILY["swiglu"].cond, tuple(t(4, 2 * 24).chunk(2, -1)), {}, True),
    (gated.FAMILY["swiglu"].cond, (t(4, 24), t(4, 24, dtype=torch.float16)), {}, False),
    (gated.FAMILY["geglu_backward"].cond, (t(4, 24), t(4, 24), t(4, 24), "tanh"), {}, True),
    (rotary.FAMILY["rotary"].cond,
     (t(2, 5, 4, 8).transpose(1, 2), t(2, 5, 2, 8).transpose(1, 2), t(2, 5, 8), t(2, 5, 8), 1), {}, True),
    (rotary.FAMILY["rotary"].cond, (t(2, 4, 5, 7), t(2, 4, 5, 7), t(2, 5, 7), t(2, 5, 7), 1), {}, False),  # odd head dim
    (model_activations.FAMILY["quick_gelu"].cond, (t(3, 10)[:, ::2],), {}, True),
    (model_activations.FAMILY["gelu_tanh_backward"].cond, (t(3, 5), t(3, 5, dtype=torch.float64)), {}, False),
]


@pytest.mark.parametrize("cond,args,kwargs,expected", CASES, ids=lambda v: getattr(v, "__name__", None))
def test_verdict_is_the_same_on_fake_tensors(cond, args, kwargs, expected):
    # Conds of planned overrides return their plan (truthy) or None; the others a bool.
    assert bool(cond(*args, **kwargs)) is expected
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        assert bool(cond(*fake, **kwargs)) is expected


def test_conds_decline_other_devices():
    other = torch.device("meta")
    assert not softmax.FAMILY["_softmax"].cond(torch.empty(4, 8, device=other), -1, False)
    assert not bmm.FAMILY["bmm"].cond(torch.empty(2, 3, 1, device=other), torch.empty(2, 1, 4, device=other))


def test_conds_are_cheap():
    x, w, b = t(64, 256), t(256), t(256)
    start = time.perf_counter()
    for _ in range(1000):
        layer_norm.FAMILY["native_layer_norm"].cond(x, [256], w, b, 1e-5)
    per_call = (time.perf_counter() - start) / 1000
    assert per_call < 1e-4, f"{per_call * 1e6:.1f} us per call"
