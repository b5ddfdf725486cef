"""``python_native::linear_cross_entropy`` (forward and backward) on the Triton cross-entropy kernels.

The op is declared by ``python_native.ops``; these overrides shadow its chunked reference at the
backend key. They run the same chunk loops (``python_native.ops.cross_entropy_chunks``: a GEMM per
chunk of logits, never the whole matrix) with Triton kernels doing each chunk's row work in one
pass and in place, where the reference spends several chunk-sized temporaries in plain torch.
Nothing is planned ahead (the chunk loops size themselves per call): a call the kernels take has
the plan ``True``.
"""

from __future__ import annotations

import torch

from python_native.ops import linear_cross_entropy_op as op
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import Driver, Sample, rand

from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor

DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
NAMESPACE = "python_native"


def _shapes_why(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str) -> str | None:
    """What the kernels take: 2-D input and weight of one kernel dtype, 1-D int64 targets (metadata only)."""
    found = why.device(input, weight, target, bias)
    if found:
        return found
    if input.dtype not in DTYPES:
        return f"dtype {why.name(input.dtype)} (the kernels take {why.names(DTYPES)})"
    if reduction not in op.REDUCTIONS:
        return f"reduction={reduction!r} (takes {', '.join(op.REDUCTIONS)})"
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != input.dtype:
            return f"{name} dtype {why.name(t.dtype)} differs from the input's {why.name(input.dtype)}"
    if input.dim() != 2 or weight.dim() != 2 or input.shape[1] != weight.shape[1]:
        return f"input {tuple(input.shape)} and weight {tuple(weight.shape)} are not (tokens, hidden), (vocabulary, hidden)"
    if not 0 < weight.shape[0] < 2**31:
        return f"a vocabulary of {weight.shape[0]} (the kernels take 1 to 2**31 - 1)"
    if target.dim() != 1 or target.shape[0] != input.shape[0] or target.dtype != torch.int64:
        return f"target {why.name(target.dtype)} {tuple(target.shape)} is not {input.shape[0]} int64 class indices"
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        return f"bias shape {tuple(bias.shape)} is not ({weight.shape[0]},)"
    return None


def forward_plan_or_why(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str,
                        ignore_index: int, label_smoothing: float) -> bool | str:
    if not 0.0 <= label_smoothing <= 1.0:
        return f"label_smoothing = {label_smoothing} is outside [0, 1]"
    return _shapes_why(input, weight, target, bias, reduction) or True


def forward_impl(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str,
                 ignore_index: int, label_smoothing: float, plan: bool = True) -> tuple[Tensor, Tensor]:
    return op.run_forward(input, weight, target, bias, reduction, ignore_index, label_smoothing,
                          FAMILY.kernels().forward_rows)


def backward_plan_or_why(grad: Tensor, input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
                         lse: Tensor, reduction: str, ignore_index: int, label_smoothing: float,
                         output_mask: list[bool]) -> bool | str:
    found = why.device(grad, lse) or _shapes_why(input, weight, target, bias, reduction)
    if found:
        return found
    if lse.dtype != torch.float32 or lse.shape != target.shape:
        return f"lse {why.name(lse.dtype)} {tuple(lse.shape)} is not one float32 per token"
    return True


def backward_impl(grad: Tensor, input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor,
                  reduction: str, ignore_index: int, label_smoothing: float, output_mask: list[bool],
                  plan: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    return op.run_backward(grad, input, weight, target, bias, lse, reduction, ignore_index, label_smoothing,
                           output_mask, FAMILY.kernels().backward_rows)


def _call(reduction: str, label_smoothing: float, bias: bool):
    def fn(x, w, t, *b):  # pn.linear_cross_entropy
        return op.linear_cross_entropy(x, w, t.long(), b[0] if bias else None, reduction, -100, label_smoothing)
    return fn


def _cases(dtype: torch.dtype, device: str):
    """``verify``'s cases, through ``pn.linear_cross_entropy``; targets travel as tensors like every input
    (the float64 run receives them as floats), so the call turns them back into class indices."""
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


FAMILY = Family(DSL_NAME, "linear_cross_entropy", [
    Op("linear_cross_entropy.forward", forward_plan_or_why, forward_impl,
       ("input", "weight", "target", "bias", "reduction", "0.0 <= label_smoothing <= 1.0"), lib=NAMESPACE,
       public_name="linear_cross_entropy", verify=Driver(_cases)),
    Op("linear_cross_entropy.backward", backward_plan_or_why, backward_impl,
       ("grad", "input", "weight", "target", "bias", "lse", "reduction"), lib=NAMESPACE,
       public_name="linear_cross_entropy", backward=True),
], kernels="cross_entropy")
