"""Drivers of the row-wise ops and bmm: softmax, log-softmax, the norms, the activations, bmm."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from python_native.tools.verify.samples import Driver, Sample, affine, finite, rand, row_cases


def _bmm_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    for name, (a_shape, b_shape) in {
        "outer product": ((3, 5, 1), (3, 1, 7)),
        "odd sizes": ((2, 17, 3), (2, 3, 9)),
        "empty batch": ((0, 4, 1), (0, 1, 4)),
    }.items():
        yield Sample(name, torch.bmm, [rand(*a_shape, dtype=dtype, device=device), rand(*b_shape, dtype=dtype, device=device)])
    a = rand(2, 1, 6, dtype=dtype, device=device).transpose(1, 2)
    b = rand(2, 5, 1, dtype=dtype, device=device).transpose(1, 2)
    yield Sample("transposed", torch.bmm, [a, b])
    yield Sample("1e4 scale", torch.bmm, [rand(2, 4, 1, dtype=dtype, device=device, scale=100.0),
                                          rand(2, 1, 4, dtype=dtype, device=device, scale=100.0)])


DRIVERS: dict[str, Driver] = {
    "_softmax": Driver(row_cases(lambda x: (lambda t: torch.softmax(t, -1), [x])),
                       ("softmax", "nn.functional.softmax"), ("_softmax_backward_data",)),
    "_log_softmax": Driver(row_cases(lambda x: (lambda t: torch.log_softmax(t, -1), [x])),
                           ("log_softmax",), ("_log_softmax_backward_data",)),
    "native_layer_norm": Driver(finite(lambda x: (lambda t, w, b: F.layer_norm(t, t.shape[-1:], w, b), affine(x))),
                                ("nn.functional.layer_norm",), ("native_layer_norm_backward",)),
    "_fused_rms_norm": Driver(finite(lambda x: (lambda t, w, _b: F.rms_norm(t, t.shape[-1:], w), affine(x))),
                              ("nn.functional.rms_norm",), ("_fused_rms_norm_backward",)),
    "silu": Driver(finite(lambda x: (F.silu, [x])), ("nn.functional.silu",), ("silu_backward",)),
    "gelu": Driver(finite(lambda x: (lambda t: F.gelu(t, approximate="tanh"), [x])),
                   ("nn.functional.gelu",), ("gelu_backward",)),
    "bmm": Driver(_bmm_cases, ("bmm",), ("bmm",)),
}
