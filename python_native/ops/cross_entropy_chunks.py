"""Linear cross-entropy in chunks: the loops every implementation shares, and the plain-torch steps.

Nothing here holds the logits of all tokens × the whole vocabulary. The loops compute one chunk
of logits at a time with a GEMM (``X_c @ W^T + b``, in the input's dtype, accumulated in fp32 by
the GEMM as ``F.linear`` is) and hand it to a *step*, which is all an implementation supplies:
the reference's steps below are plain torch, the Triton library's are kernels that work on the
chunk in place.

Forward, in token chunks: each chunk's rows are whole (every class of its tokens), so a forward
step computes each token's loss and log-sum-exp (fp32) exactly; the chunk is then dropped.

Backward, recomputing the logits: with the forward's log-sum-exp saved, each logit's gradient is
local, ``dz = (softmax(z) - q) * s`` with ``q = (1 - ε)·onehot(target) + ε/V`` and ``s`` the
token's share of the output gradient (0 where the target is ignored). A backward step turns a
chunk of logits into ``dz`` in place, so the backward may slice either axis and keeps in fp32
only the smaller of the two gradients that accumulate across slices:

- ``N ≤ V`` (an LLM's head): vocabulary slices. ``grad_weight[slice] = dz^T @ X`` is one GEMM over
  every token, written once; ``grad_input`` (N × H) accumulates in fp32.
- ``N > V``: token chunks. ``grad_input[chunk] = dz @ W`` is written once; ``grad_weight`` (V × H)
  accumulates in fp32.

A chunk holds about as many logits as the input has elements (at least ``MIN_CHUNK_ELEMENTS``,
at most ``MAX_CHUNK_ELEMENTS``). The recomputation costs one GEMM more than the unfused
backward; what it saves is every logit-sized tensor between forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor

MIN_CHUNK_ELEMENTS = 1 << 20
MAX_CHUNK_ELEMENTS = 1 << 26

# step(logits, target, ignore_index, label_smoothing, loss_out, lse_out): fills both (fp32) per row.
ForwardStep = Callable[[Tensor, Tensor, int, float, Tensor, Tensor], None]
# step(logits, col_offset, vocab, target, lse, scale, label_smoothing) -> dz (logits' storage).
BackwardStep = Callable[[Tensor, int, int, Tensor, Tensor, Tensor, float], Tensor]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32 and half-precision inputs; fp64 stays fp64 (a float64 reference stays exact)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_len(n_other: int, row_elements: int) -> int:
    """How many rows of ``n_other`` logits each one chunk takes (the budget: about the input's size)."""
    budget = min(max(row_elements, MIN_CHUNK_ELEMENTS), MAX_CHUNK_ELEMENTS)
    return max(1, budget // max(n_other, 1))


def _logits(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.addmm(b, x, w.t()) if b is not None else torch.mm(x, w.t())


_MM_TO_FP32 = [True]  # whether ``torch.mm(..., out_dtype=torch.float32)`` works for half inputs on CUDA


def _add_product(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` with ``acc`` fp32 (or fp64); half-precision products stay fp32 where torch can."""
    if a.dtype in (torch.float16, torch.bfloat16) and a.is_cuda and _MM_TO_FP32[0]:
        try:
            acc.add_(torch.mm(a, b, out_dtype=torch.float32))
            return
        except (RuntimeError, TypeError):
            _MM_TO_FP32[0] = False
    acc.add_(a @ b)


def check_targets(target: Tensor, vocab: int, ignore_index: int) -> None:
    """``IndexError`` naming a target outside ``[0, vocab)`` that is not ``ignore_index`` (reads data)."""
    if target.numel() == 0 or (target.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        value = int(target[bad][0])
        raise IndexError(f"linear_cross_entropy: target {value} is out of bounds for {vocab} classes "
                         f"(allowed: 0..{vocab - 1}, or ignore_index={ignore_index})")


def forward(x: Tensor, w: Tensor, target: Tensor, b: Tensor | None, ignore_index: int, label_smoothing: float,
            step: ForwardStep) -> tuple[Tensor, Tensor]:
    """Per-token loss (0 where ignored) and log-sum-exp (``accumulation_dtype``), in token chunks."""
    n, vocab = x.shape[0], w.shape[0]
    target = target.long()
    loss = torch.empty(n, dtype=accumulation_dtype(x.dtype), device=x.device)
    lse = torch.empty_like(loss)
    rows = chunk_len(vocab, x.numel())
    for start in range(0, n, rows):
        end = min(n, start + rows)
        step(_logits(x[start:end], w, b), target[start:end], ignore_index, label_smoothing,
             loss[start:end], lse[start:end])
    return loss, lse


def reduce(loss: Tensor, target: Tensor, reduction: str, ignore_index: int) -> Tensor:
    """The ``.forward`` overload's loss from per-token losses, as ``F.cross_entropy`` reduces (mean over
    kept tokens), kept in ``loss``'s dtype (``accumulation_dtype``): never rounded to a half-precision
    input's dtype, so a sum of per-token losses taken after keeps fp32's precision."""
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "mean":
        total = total / (target != ignore_index).sum()
    return total


def row_scale(grad: Tensor, target: Tensor, reduction: str, ignore_index: int) -> Tensor:
    """Each token's share of the output gradient (``accumulation_dtype``), 0 where its target is ignored."""
    kept = target != ignore_index
    g = grad.to(accumulation_dtype(grad.dtype))
    if reduction == "mean":
        g = g / kept.sum()
    return torch.where(kept, g.expand(target.shape), 0.0)


def backward(grad: Tensor, x: Tensor, w: Tensor, target: Tensor, b: Tensor | None, lse: Tensor, reduction: str,
             ignore_index: int, label_smoothing: float, mask: list[bool], step: BackwardStep,
             ) -> tuple[Tensor, Tensor, Tensor]:
    """``(grad_input, grad_weight, grad_bias)``; an entry ``mask`` leaves out is an empty tensor."""
    n, vocab = x.shape[0], w.shape[0]
    want_x, want_w, want_b = mask[0], mask[1], mask[2] and b is not None
    empty = x.new_empty(0)
    target = target.long()
    if n == 0:
        return (torch.zeros_like(x) if want_x else empty, torch.zeros_like(w) if want_w else empty,
                torch.zeros_like(b) if want_b else empty)
    scale = row_scale(grad, target, reduction, ignore_index)
    if n <= vocab:
        return _by_vocab_slices(x, w, target, b, lse, scale, label_smoothing, step, want_x, want_w, want_b)
    return _by_token_chunks(x, w, target, b, lse, scale, label_smoothing, step, want_x, want_w, want_b)


def _by_vocab_slices(x, w, target, b, lse, scale, smoothing, step, want_x, want_w, want_b):
    n, vocab = x.shape[0], w.shape[0]
    acc_x = torch.zeros(x.shape, dtype=accumulation_dtype(x.dtype), device=x.device) if want_x else None
    grad_w = torch.empty_like(w, memory_format=torch.contiguous_format) if want_w else x.new_empty(0)
    grad_b = torch.empty_like(b) if want_b else x.new_empty(0)
    width = chunk_len(n, x.numel())
    for start in range(0, vocab, width):
        end = min(vocab, start + width)
        dz = step(_logits(x, w[start:end], b[start:end] if b is not None else None), start, vocab,
                  target, lse, scale, smoothing)
        if want_w:
            torch.mm(dz.t(), x, out=grad_w[start:end])
        if want_b:
            grad_b[start:end] = dz.sum(0, dtype=accumulation_dtype(dz.dtype))
        if acc_x is not None:
            _add_product(acc_x, dz, w[start:end])
    grad_x = acc_x.to(x.dtype) if acc_x is not None else x.new_empty(0)
    return grad_x, grad_w, grad_b


def _by_token_chunks(x, w, target, b, lse, scale, smoothing, step, want_x, want_w, want_b):
    n, vocab = x.shape[0], w.shape[0]
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if want_x else x.new_empty(0)
    acc = accumulation_dtype(x.dtype)
    acc_w = torch.zeros(w.shape, dtype=acc, device=w.device) if want_w else None
    acc_b = torch.zeros(vocab, dtype=acc, device=w.device) if want_b else None
    rows = chunk_len(vocab, x.numel())
    for start in range(0, n, rows):
        end = min(n, start + rows)
        xc = x[start:end]
        dz = step(_logits(xc, w, b), 0, vocab, target[start:end], lse[start:end], scale[start:end], smoothing)
        if want_x:
            torch.mm(dz, w, out=grad_x[start:end])
        if acc_w is not None:
            _add_product(acc_w, dz.t(), xc)
        if acc_b is not None:
            acc_b.add_(dz.sum(0, dtype=acc))
    grad_w = acc_w.to(w.dtype) if acc_w is not None else x.new_empty(0)
    grad_b = acc_b.to(b.dtype) if acc_b is not None else x.new_empty(0)
    return grad_x, grad_w, grad_b


# ----- the reference's steps: plain torch on one chunk -----


def torch_forward_step(logits: Tensor, target: Tensor, ignore_index: int, label_smoothing: float,
                       loss_out: Tensor, lse_out: Tensor) -> None:
    z = logits.to(accumulation_dtype(logits.dtype))
    lse = torch.logsumexp(z, -1)
    kept = target != ignore_index
    picked = z.gather(1, torch.where(kept, target, 0).unsqueeze(1)).squeeze(1)
    loss = lse - (1.0 - label_smoothing) * picked
    if label_smoothing:
        loss = loss - label_smoothing * z.mean(-1)
    loss_out.copy_(torch.where(kept, loss, 0.0))
    lse_out.copy_(lse)


def torch_backward_step(logits: Tensor, col_offset: int, vocab: int, target: Tensor, lse: Tensor, scale: Tensor,
                        label_smoothing: float) -> Tensor:
    width = logits.shape[1]
    # In place where the chunk already has the accumulation dtype: no chunk-sized temporaries.
    dz = logits if logits.dtype == lse.dtype else logits.to(lse.dtype)
    dz.sub_(lse.unsqueeze(1)).exp_()
    if label_smoothing:
        dz.sub_(label_smoothing / vocab)
    dz.mul_(scale.unsqueeze(1))
    cols = target - col_offset
    inside = (cols >= 0) & (cols < width)
    hit = torch.where(inside, -(1.0 - label_smoothing) * scale, 0.0).to(dz.dtype)
    dz.scatter_add_(1, cols.clamp(0, max(width - 1, 0)).unsqueeze(1), hit.unsqueeze(1))
    if dz is not logits:
        logits.copy_(dz)
    return logits
