"""``python_native::linear_cross_entropy``: a linear layer and its cross-entropy loss, fused.

``F.cross_entropy(F.linear(input, weight, bias), target, ...)`` materialises the logits, tokens ×
vocabulary (8192 × 128256 in bf16 is 2 GiB), and autograd keeps logit-sized tensors from forward
to backward: the largest activation of an LLM's training step. This op computes the same loss and
gradients chunk by chunk (``cross_entropy_chunks``) and keeps only one fp32 log-sum-exp per token.

Three overloads of one packet, so ``pn.operations_disabled("linear_cross_entropy")`` covers all:

- ``linear_cross_entropy`` (what users call): composite, returns the loss;
- ``linear_cross_entropy.forward`` -> ``(loss, lse)``: the reference kernel, a fake kernel and
  autograd; overrides attach here. Its loss (per token, or reduced) is fp32 for half-precision
  inputs (``cross_entropy_chunks.accumulation_dtype``): the causal-LM loss rule sums per-token
  losses that were never rounded to bf16. The composite casts it to the input's dtype, as
  ``F.cross_entropy`` returns it;
- ``linear_cross_entropy.backward`` -> ``(grad_input, grad_weight, grad_bias)``, recomputing the
  logits from the saved log-sum-exp; overrides attach here too. Gradients ``output_mask`` leaves
  out come back as empty tensors.
"""

from __future__ import annotations

import torch

from python_native.foundations import custom_ops, module_scope
from python_native.ops import cross_entropy_chunks as chunks

Tensor = torch.Tensor

REDUCTIONS = ("mean", "sum", "none")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
TARGET_DTYPES = (torch.int64, torch.int32)

_ARGS = ("Tensor input, Tensor weight, Tensor target, Tensor? bias=None, str reduction='mean', "
         "int ignore_index=-100, float label_smoothing=0.0")
SCHEMA = f"linear_cross_entropy({_ARGS}) -> Tensor"
FORWARD_SCHEMA = f"linear_cross_entropy.forward({_ARGS}) -> (Tensor, Tensor)"
BACKWARD_SCHEMA = (
    "linear_cross_entropy.backward(Tensor grad, Tensor input, Tensor weight, Tensor target, Tensor? bias, "
    "Tensor lse, str reduction, int ignore_index, float label_smoothing, bool[3] output_mask) "
    "-> (Tensor, Tensor, Tensor)"
)


def check_arguments(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str,
                    label_smoothing: float) -> None:
    """``ValueError`` naming the first argument the op cannot take (metadata only: FakeTensor safe)."""
    if input.dim() != 2:
        raise ValueError(f"linear_cross_entropy: input must be 2-D (tokens, hidden), got shape {tuple(input.shape)}")
    if input.dtype not in FLOAT_DTYPES:
        raise ValueError(f"linear_cross_entropy: input dtype {input.dtype} is not one of {list(FLOAT_DTYPES)}")
    if weight.dim() != 2 or weight.shape[1] != input.shape[1] or weight.shape[0] == 0:
        raise ValueError(f"linear_cross_entropy: weight must be (vocabulary > 0, hidden={input.shape[1]}), "
                         f"got shape {tuple(weight.shape)}")
    if target.dim() != 1 or target.shape[0] != input.shape[0] or target.dtype not in TARGET_DTYPES:
        raise ValueError(f"linear_cross_entropy: target must be 1-D of {input.shape[0]} class indices "
                         f"({' or '.join(map(str, TARGET_DTYPES))}), got shape {tuple(target.shape)}, {target.dtype}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"linear_cross_entropy: bias must be 1-D of {weight.shape[0]} (the vocabulary), "
                         f"got shape {tuple(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dtype != input.dtype or t.device != input.device):
            raise ValueError(f"linear_cross_entropy: {name} is {t.dtype} on {t.device}; input is {input.dtype} "
                             f"on {input.device} (they must match)")
    if target.device != input.device:
        raise ValueError(f"linear_cross_entropy: target is on {target.device}, input on {input.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction={reduction!r}; allowed: {list(REDUCTIONS)}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing={label_smoothing} must be within [0.0, 1.0]")


def run_forward(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, reduction: str,
                ignore_index: int, label_smoothing: float, step: chunks.ForwardStep) -> tuple[Tensor, Tensor]:
    """The forward with ``step`` doing each chunk's rows: ``(loss, lse)``, as the ``.forward`` overload returns."""
    check_arguments(input, weight, target, bias, reduction, label_smoothing)
    chunks.check_targets(target, weight.shape[0], ignore_index)
    loss, lse = chunks.forward(input, weight, target, bias, ignore_index, label_smoothing, step)
    return chunks.reduce(loss, target, reduction, ignore_index), lse


def run_backward(grad: Tensor, input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, lse: Tensor,
                 reduction: str, ignore_index: int, label_smoothing: float, output_mask: list[bool],
                 step: chunks.BackwardStep) -> tuple[Tensor, Tensor, Tensor]:
    """The backward with ``step`` turning each chunk of logits into their gradient (never recorded by
    autograd: the op has no derivative of its own, and a direct call may pass tensors that need grad)."""
    with torch.no_grad():
        return chunks.backward(grad, input, weight, target, bias, lse, reduction, ignore_index, label_smoothing,
                               list(output_mask), step)


# ----- the custom ops -----


def _reference_forward(input, weight, target, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    return run_forward(input, weight, target, bias, reduction, ignore_index, label_smoothing,
                       chunks.torch_forward_step)


def _reference_backward(grad, input, weight, target, bias, lse, reduction, ignore_index, label_smoothing,
                        output_mask):
    return run_backward(grad, input, weight, target, bias, lse, reduction, ignore_index, label_smoothing,
                        output_mask, chunks.torch_backward_step)


def _fake_forward(input, weight, target, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    check_arguments(input, weight, target, bias, reduction, label_smoothing)
    n, dtype = input.shape[0], chunks.accumulation_dtype(input.dtype)
    return input.new_empty((n,) if reduction == "none" else (), dtype=dtype), input.new_empty((n,), dtype=dtype)


def _fake_backward(grad, input, weight, target, bias, lse, reduction, ignore_index, label_smoothing, output_mask):
    empty = input.new_empty(0)
    return (torch.empty_like(input) if output_mask[0] else empty,
            torch.empty_like(weight) if output_mask[1] else empty,
            torch.empty_like(bias) if output_mask[2] and bias is not None else empty)


def _setup_context(ctx, inputs, output) -> None:
    input, weight, target, bias, reduction, ignore_index, label_smoothing = inputs
    ctx.save_for_backward(input, weight, target, bias, output[1])
    ctx.options = (reduction, ignore_index, label_smoothing)
    ctx.module = module_scope.current()  # the backward's trace events name the forward's module
    ctx.mark_non_differentiable(output[1])


def _autograd_backward(ctx, grad_loss, _grad_lse):
    input, weight, target, bias, lse = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = [needs[0], needs[1], bias is not None and needs[3]]
    with module_scope.inside(ctx.module):
        grad_input, grad_weight, grad_bias = torch.ops.python_native.linear_cross_entropy.backward(
            grad_loss, input, weight, target, bias, lse, *ctx.options, mask)
    return (grad_input if mask[0] else None, grad_weight if mask[1] else None, None,
            grad_bias if mask[2] else None, None, None, None)


def full_precision_loss(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None,
                        reduction: str = "mean", ignore_index: int = -100, label_smoothing: float = 0.0) -> Tensor:
    """The loss as the ``.forward`` overload returns it, fp32 for half-precision inputs (never
    rounded to their dtype). Under autocast, as autocast runs F.linear then F.cross_entropy: the
    GEMMs in the autocast dtype, the loss in fp32; the casts sit above autograd, so fp32 parameters
    get fp32 gradients."""
    device = input.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        input, weight, bias = input.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None
    return FORWARD(input, weight, target, bias, reduction, ignore_index, label_smoothing)[0]


def _composite(input, weight, target, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    loss = full_precision_loss(input, weight, target, bias, reduction, ignore_index, label_smoothing)
    # In the input's dtype, as F.cross_entropy returns it; in fp32 under autocast, as there.
    return loss if torch.is_autocast_enabled(input.device.type) else loss.to(input.dtype)


# The user-facing overload first: a call of the packet resolves to the first overload that fits.
OP = custom_ops.declare(SCHEMA, composite=_composite,
                      doc="F.cross_entropy(F.linear(input, weight, bias), target, ...) without the logits")
FORWARD = custom_ops.declare(FORWARD_SCHEMA, reference=_reference_forward, fake=_fake_forward,
                           backward=_autograd_backward, setup_context=_setup_context,
                           doc="(loss, per-token log-sum-exp) in token chunks, both fp32 for half inputs")
BACKWARD = custom_ops.declare(BACKWARD_SCHEMA, reference=_reference_backward, fake=_fake_backward,
                            doc="gradients recomputing the logits chunk by chunk")


def linear_cross_entropy(input: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None,
                         reduction: str = "mean", ignore_index: int = -100, label_smoothing: float = 0.0) -> Tensor:
    """``F.cross_entropy(F.linear(input, weight, bias), target, ...)`` without materialising the logits.

    ``input`` is (tokens, hidden), ``weight`` (vocabulary, hidden), ``target`` (tokens,) class
    indices; float32, bfloat16 or float16 (statistics and accumulations in fp32). Differentiable
    in ``input``, ``weight`` and ``bias``. Calls ``torch.ops.python_native.linear_cross_entropy``,
    so installed overrides (the Triton kernels) serve it, and the chunked reference otherwise.
    """
    return OP(input, weight, target, bias, reduction, ignore_index, label_smoothing)
