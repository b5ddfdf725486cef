"""Benchmark rows of the ops both backends override: softmax, log-softmax, the norms, the reductions.

Declared once here and attached with ``bench_rows=`` to the forward op of each backend that
declares the op; ``python -m python_native bench`` measures a row once, whichever declares it
first. Also what rows of several families share: the row grid of the row-wise ops (LLM hidden
sizes and vocabularies), the inputs of a normalization, the bytes of an elementwise op.
Light: torch only, nothing run at import.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from python_native_dsls.proving import FORWARD, BenchRow, LlmCase, Tensors, elementwise_bytes, leaf, x_input

__all__ = ["FULL_ROWS", "IO_BYTES", "LAYER_NORM", "LOG_SOFTMAX", "QUICK_ROWS", "REDUCTIONS", "RMS_NORM", "SOFTMAX",
           "norm_inputs"]

# Rows x columns of the row-wise ops: tiny ones for the interpreter, and the hidden sizes of LLMs.
QUICK_ROWS = ((4, 64), (7, 100))
FULL_ROWS = ((4096, 4096), (8192, 4096), (16384, 5120), (4096, 8192), (32768, 1024))
# Forward reads x and writes y (2 tensors); with the backward, it reads x (or y) and dy and writes
# dx (3 more). Weights and per-row statistics are small beside them, and not counted.
IO_BYTES = elementwise_bytes(2, 5)


def norm_inputs(bias: bool, channel_dim: int = -1, channels_last: bool = False,
                ) -> Callable[[tuple[int, ...], torch.dtype, str, bool], Tensors]:
    """``BenchRow.inputs`` of a normalization: ``x``, a weight ``w`` (and a bias ``b``) as long as
    x's dim ``channel_dim``, and ``dy`` in x's layout (channels-last where x is), as autograd hands it."""
    layout = torch.channels_last if channels_last else torch.contiguous_format

    def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> Tensors:
        x = leaf(torch.randn(*shape, device=device, dtype=dtype).contiguous(memory_format=layout), grad)
        params = {"w": leaf(torch.randn(shape[channel_dim], device=device, dtype=dtype), grad)}
        if bias:
            params["b"] = leaf(torch.randn(shape[channel_dim], device=device, dtype=dtype), grad)
        dy = torch.randn_like(x) if grad else None
        return {"x": x, **params, "leaves": [x, *params.values()] if grad else [], "dy": dy}

    return inputs


RMS_NORM = BenchRow("rms_norm", QUICK_ROWS, FULL_ROWS, norm_inputs(bias=False),
                    lambda t: F.rms_norm(t["x"], (t["x"].shape[-1],), t["w"], 1e-6), IO_BYTES,
                    llm=tuple(LlmCase("fwd+bwd", s) for s in ((16384, 4096), (8192, 8192), (32768, 2048))))
LAYER_NORM = BenchRow("layer_norm", QUICK_ROWS, FULL_ROWS, norm_inputs(bias=True),
                      lambda t: F.layer_norm(t["x"], (t["x"].shape[-1],), t["w"], t["b"]), IO_BYTES,
                      llm=tuple(LlmCase("fwd+bwd", s) for s in ((16384, 4096), (32768, 1024))))
# Softmax over a Llama-2 and a Llama-3 vocabulary, and over attention-sized rows.
SOFTMAX = BenchRow("softmax", QUICK_ROWS, FULL_ROWS, x_input(), lambda t: torch.softmax(t["x"], -1), IO_BYTES,
                   llm=(LlmCase("fwd", (4096, 32000)), LlmCase("fwd+bwd", (4096, 32000)),
                        LlmCase("fwd", (2048, 128256)), LlmCase("fwd+bwd", (16384, 4096))))
# The grid times its forward; the loss of a vocabulary row is timed with its backward, in fp32.
LOG_SOFTMAX = BenchRow("log_softmax", QUICK_ROWS, FULL_ROWS, x_input(), lambda t: torch.log_softmax(t["x"], -1),
                       IO_BYTES, modes=FORWARD, llm=(LlmCase("fwd+bwd", (4096, 32000), torch.float32),))

# Reductions at LLM shapes: hidden states, MLP rows, many narrow rows, and one vocabulary row (sampling).
_REDUCE_SHAPES = ((4096, 4096), (8192, 4096), (32768, 1024), (1, 128256))


def _reduction(name: str, call: Callable[[torch.Tensor], torch.Tensor], dim: int = -1, values: bool = True,
               index: bool = False) -> BenchRow:
    """A reduction's row, forward only (its backward is aten's formula: expand, scatter, a masked
    division): the input read once, each kept position's value (input dtype) and/or index (int64) written."""

    def moved(shape: tuple[int, ...], mode: str, itemsize: int) -> int:
        kept = math.prod(shape) // shape[dim]
        return math.prod(shape) * itemsize + kept * (itemsize * values + 8 * index)

    llm = tuple(LlmCase("fwd", s, dtype) for dtype in (torch.bfloat16, torch.float32) for s in _REDUCE_SHAPES)
    return BenchRow(name, QUICK_ROWS, (), x_input(), lambda t: call(t["x"]), moved, modes=FORWARD, llm=llm)


REDUCTIONS: dict[str, BenchRow] = {row.name: row for row in (
    _reduction("sum", lambda x: x.sum(-1)),
    _reduction("sum_dim0", lambda x: x.sum(0), dim=0),
    _reduction("mean", lambda x: x.mean(-1)),
    _reduction("prod", lambda x: x.prod(-1)),
    _reduction("amax", lambda x: x.amax(-1)),
    _reduction("amin", lambda x: x.amin(-1)),
    _reduction("argmax", lambda x: x.argmax(-1), values=False, index=True),
    _reduction("argmin", lambda x: x.argmin(-1), values=False, index=True),
    _reduction("max_dim", lambda x: torch.max(x, -1).values, index=True),
    _reduction("min_dim", lambda x: torch.min(x, -1).values, index=True),
)}
