"""``python_native::rms_norm``: RMSNorm as the hand-written modules of language models compute it.

transformers writes RMSNorm by hand in every Llama-style family (``x.float()``, ``pow(2)``,
``mean``, ``rsqrt``, multiply, cast back, then the weight), so ``aten::rms_norm`` never runs and
no override can take the norm. Families differ only in where the weight is applied, which this
op's two flags name, and its reference computes exactly what those modules compute (bit for bit):

- ``weight_in_fp32=False`` (Llama, Qwen, Mistral...): normalise in fp32, cast back to the input's
  dtype, then multiply by ``weight`` (by ``offset + weight`` when ``offset`` is not 0); the result
  dtype promotes, as the module's does;
- ``weight_in_fp32=True`` (Gemma: ``offset=1.0``; Olmo2: ``offset=0.0``): multiply by
  ``offset + weight.float()`` in fp32, then cast back.

The norm runs over the last dim of a tensor of any rank (q/k norms over the head dim of 4-D
tensors included). ``rms_norm_backward`` returns ``(grad_input, grad_weight)``, computed in fp32.

The name is aten's too (``aten::rms_norm`` is a composite without a kernel of its own), so one
public name, ``rms_norm``, switches aten's overrides and this op's alike.
"""

from __future__ import annotations

import torch

from python_native.foundations import custom_ops, module_scope, public_names

Tensor = torch.Tensor

SCHEMA = "rms_norm(Tensor input, Tensor weight, float eps, float offset=0.0, bool weight_in_fp32=False) -> Tensor"
BACKWARD_SCHEMA = ("rms_norm_backward(Tensor grad_output, Tensor input, Tensor weight, float eps, float offset, "
                   "bool weight_in_fp32) -> (Tensor, Tensor)")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_arguments(input: Tensor, weight: Tensor) -> None:
    """``ValueError`` naming what the op cannot take (metadata only: FakeTensor safe)."""
    if input.dim() < 1 or weight.dim() != 1 or weight.shape[0] != input.shape[-1]:
        raise ValueError(f"rms_norm: weight must be 1-D of the input's last dim ({input.shape[-1] if input.dim() else '-'}), "
                         f"got weight {tuple(weight.shape)} for input {tuple(input.shape)}")
    for name, t in (("input", input), ("weight", weight)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"rms_norm: {name} dtype {t.dtype} is not one of {list(FLOAT_DTYPES)}")


def normalized(input: Tensor, eps: float) -> Tensor:
    """The fp32 normalised input, as the modules compute it (the step every variant shares)."""
    h = input.to(torch.float32)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def output_dtype(input: Tensor, weight: Tensor, weight_in_fp32: bool) -> torch.dtype:
    return input.dtype if weight_in_fp32 else torch.promote_types(weight.dtype, input.dtype)


def _reference(input: Tensor, weight: Tensor, eps: float, offset: float = 0.0, weight_in_fp32: bool = False) -> Tensor:
    check_arguments(input, weight)
    h = normalized(input, eps)
    if weight_in_fp32:
        return (h * (offset + weight.float() if offset != 0.0 else weight.float())).to(input.dtype)
    w = weight if offset == 0.0 else offset + weight
    return w * h.to(input.dtype)


def _reference_backward(grad_output: Tensor, input: Tensor, weight: Tensor, eps: float, offset: float,
                        weight_in_fp32: bool) -> tuple[Tensor, Tensor]:
    check_arguments(input, weight)
    with torch.no_grad():
        h = input.to(torch.float32)
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        n = h * rstd
        grad = grad_output.to(torch.float32)
        # What multiplied the weight in the forward: the cast-back norm, or the fp32 one.
        scaled = n if weight_in_fp32 else n.to(input.dtype).to(torch.float32)
        grad_weight = (grad * scaled).reshape(-1, weight.shape[0]).sum(0).to(weight.dtype)
        grad_n = grad * (offset + weight.to(torch.float32))
        grad_input = rstd * (grad_n - n * (grad_n * n).mean(-1, keepdim=True))
        return grad_input.to(input.dtype), grad_weight


def _fake(input: Tensor, weight: Tensor, eps: float, offset: float = 0.0, weight_in_fp32: bool = False) -> Tensor:
    check_arguments(input, weight)
    return torch.empty_like(input, dtype=output_dtype(input, weight, weight_in_fp32))


def _fake_backward(grad_output: Tensor, input: Tensor, weight: Tensor, eps: float, offset: float,
                   weight_in_fp32: bool) -> tuple[Tensor, Tensor]:
    check_arguments(input, weight)
    return torch.empty_like(input), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    input, weight, eps, offset, weight_in_fp32 = inputs
    ctx.save_for_backward(input, weight)
    ctx.options = (eps, offset, weight_in_fp32)
    ctx.module = module_scope.current()


def _autograd_backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    with module_scope.inside(ctx.module):
        grad_input, grad_weight = BACKWARD(grad_output, input, weight, *ctx.options)
    needs = ctx.needs_input_grad
    return (grad_input if needs[0] else None, grad_weight if needs[1] else None, None, None, None)


OP = custom_ops.declare(SCHEMA, reference=_reference, fake=_fake, backward=_autograd_backward,
                      setup_context=_setup_context, aten_namesake=True,
                      doc="hand-written RMSNorm: fp32 statistics, the weight before or after the cast back")
BACKWARD = custom_ops.declare(BACKWARD_SCHEMA, reference=_reference_backward, fake=_fake_backward,
                            doc="(grad_input, grad_weight) of rms_norm, in fp32")
public_names.declare("rms_norm", "rms_norm")
public_names.declare("rms_norm", "rms_norm_backward", backward=True)


def rms_norm(input: Tensor, weight: Tensor, eps: float, offset: float = 0.0, weight_in_fp32: bool = False) -> Tensor:
    """RMSNorm over the last dim of ``input`` as transformers' modules write it (see the module's
    docstring for ``offset`` and ``weight_in_fp32``). Calls ``torch.ops.python_native.rms_norm``,
    so installed overrides serve it, and the plain-torch reference otherwise."""
    return OP(input, weight, eps, offset, weight_in_fp32)


_sharding_registered = False


def register_dtensor_sharding() -> None:
    """DTensor's placements for ``rms_norm``, registered by ``pn.patch`` where DTensor is loaded
    (importing DTensor costs more than the op): the input sharded on any dim but the normalised last one (or
    replicated), the weight replicated; the backward's ``grad_weight`` is then each rank's partial
    sum. DTensor redistributes inputs placed otherwise (a shard of the last dim is gathered)."""
    global _sharding_registered
    if _sharding_registered:
        return
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    options = (None, None, None)  # eps, offset, weight_in_fp32

    @register_sharding(OP)
    def forward(input, weight, *args):
        rows = [Shard(d) for d in range(input.ndim - 1)]
        return [([Replicate()], [Replicate(), Replicate(), *options]),
                *(([p], [p, Replicate(), *options]) for p in rows)]

    @register_sharding(BACKWARD)
    def backward(grad_output, input, weight, *args):
        rows = [Shard(d) for d in range(input.ndim - 1)]
        return [([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate(), *options]),
                *(([p, Partial()], [p, p, Replicate(), *options]) for p in rows)]

    _sharding_registered = True
