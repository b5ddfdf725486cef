"""Driver of the fused linear cross-entropy (``python_native::linear_cross_entropy``), forward and backward.

Reached through ``pn.linear_cross_entropy``; with the DSL disabled the call runs the op's chunked
reference, and in float64 that reference is the truth. (The tests also hold the op to aten's
unfused ``F.cross_entropy(F.linear(...))``.) Targets travel as tensors like every input, so the
float64 run receives them as floats: the sample turns them back into class indices.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from python_native.tools.verify.samples import Driver, Sample, rand


def _call(reduction: str, label_smoothing: float, bias: bool):
    import python_native as pn

    def fn(x, w, t, *b):
        return pn.linear_cross_entropy(x, w, t.long(), b[0] if bias else None, reduction, -100, label_smoothing)
    return fn


def _cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    for name, (n, hidden, vocab, reduction, smoothing, bias) in {
        "64x32x100, ignored targets": (64, 32, 100, "mean", 0.0, True),
        "label smoothing, sum": (64, 32, 100, "sum", 0.1, True),
        "per-token losses": (40, 16, 77, "none", 0.05, False),
        "more tokens than classes": (48, 16, 20, "mean", 0.0, True),
        "no tokens": (0, 16, 20, "sum", 0.0, False),
    }.items():
        x = rand(n, hidden, dtype=dtype, device=device)
        w = rand(vocab, hidden, dtype=dtype, device=device, scale=hidden**-0.5)
        t = torch.randint(0, vocab, (n,), device=device)
        t[::5] = -100
        inputs = [x, w, t] + ([rand(vocab, dtype=dtype, device=device)] if bias else [])
        yield Sample(name, _call(reduction, smoothing, bias), inputs)


DRIVERS: dict[str, Driver] = {
    "linear_cross_entropy.forward": Driver(_cases, (), ("linear_cross_entropy.backward",)),
}
