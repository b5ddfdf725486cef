"""``native_dropout``, ``native_dropout_backward`` and ``bernoulli_.float`` on the Philox kernels.

``F.dropout`` reaches ``native_dropout`` only where aten's composite ``dropout`` picks its fused
kernel: CUDA (and XPU, lazy, privateuse1) tensors with ``0 < p < 1`` in training. On CPU it
computes ``x * empty_like(x).bernoulli_(1 - p).div_(1 - p)``, so under the interpreter the public
call reaches ``bernoulli_.float``, overridden here with the same random stream; the feature
dropouts (``F.dropout2d``, ``F.dropout3d``) take that path on every device.

Accepted: fp32, fp16 and bf16 tensors, non-empty, dense (any dim order; outputs share the input's
strides), up to ``2**31 - 2**20`` elements, ``0 <= p <= 1``. ``native_dropout`` declines
``train=False`` (aten returns a copy and an all-True mask: nothing random) and, at the CUDA key,
``p = 1`` (aten's CUDA kernel then returns zeros without drawing, where ours would keep a NaN as
NaN); under the interpreter ``p = 1`` runs and gives what aten's CPU kernel gives (``x * 0 * 0``).
``native_dropout_backward`` takes a bool mask shaped and strided like the gradient (at the CUDA
key, a gradient dense in its suggested memory format, the layout aten gives the result there).
``bernoulli_.float`` takes a generator on the tensor's device or none (a generator made without a
device index, ``torch.Generator("cuda")``, is on the current device of its type).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import torch

from python_native_dsls.family import Family, Op

from ..plans.elementwise import ElementwisePlan, plan_elementwise
from ..plans.layout import backend_device, dense_like
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor
_DROPOUT, _BERNOULLI, _MASKED_SCALE = 0, 1, 2  # kernel modes, part of each launch key


def _suggested_format_dense(t: Tensor) -> bool:
    """``t`` is dense in ``suggest_memory_format(t)``: ``empty_like(t, memory_format=...)``, what aten's
    CUDA kernel allocates, is then ``t``'s own layout."""
    from torch._prims_common import suggest_memory_format

    return t.is_contiguous(memory_format=suggest_memory_format(t))


def _fp32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def dropout_scale(p: float, cuda: bool) -> float:
    """aten's ``1 / (1 - p)``: in double on CPU (0 at ``p = 1``); on CUDA of ``1 - p`` rounded to
    fp32 first. The kernel rounds it to fp32 either way."""
    keep = 1.0 - p
    if cuda:
        return 1.0 / _fp32(keep)
    return 0.0 if keep == 0 else 1.0 / keep


def _p_why(p: float) -> str | None:
    return None if 0.0 <= p <= 1.0 else f"p = {p} is outside [0, 1]"


def dropout_plan_or_why(input: Tensor, p: float, train: bool | None) -> ElementwisePlan | str:
    """The flat launch where the kernel takes the call, else why not (the plan holds nothing of ``p``)."""
    if train is False:
        return "train=False: aten returns a copy and an all-True mask, nothing random to draw"
    found = _p_why(p)
    if found:
        return found
    if p == 1.0 and backend_device() == "cuda":
        return "p = 1 at the CUDA key: aten returns zeros without drawing (ours would keep a NaN as NaN)"
    return why.elementwise(input) or plan_elementwise(input, _DROPOUT)


def dropout_impl(input: Tensor, p: float, train: bool | None, plan: ElementwisePlan | None = None) -> tuple[Tensor, Tensor]:
    kernels = FAMILY.kernels()
    seed = kernels.draw_seed(input)
    return kernels.run_dropout(input, plan or plan_elementwise(input, _DROPOUT), seed, p,
                               dropout_scale(p, input.is_cuda))


def dropout_backward_plan_or_why(grad_output: Tensor, mask: Tensor, scale: float) -> ElementwisePlan | str:
    found = why.device(grad_output, mask) or why.dtype(grad_output, "grad dtype")
    if found:
        return found
    if mask.dtype != torch.bool:
        return f"mask dtype {why.name(mask.dtype)} (the kernel takes bool)"
    found = why.elementwise(grad_output)
    if found:
        return found
    if not dense_like(grad_output, mask):
        return "layout: grad and mask differ in shape or strides"
    if backend_device() == "cuda" and not _suggested_format_dense(grad_output):
        return "layout: grad is not dense in its suggested memory format, the layout aten's CUDA kernel gives its result"
    return plan_elementwise(grad_output, _MASKED_SCALE, mask)


def dropout_backward_impl(grad_output: Tensor, mask: Tensor, scale: float, plan: ElementwisePlan | None = None) -> Tensor:
    plan = plan or plan_elementwise(grad_output, _MASKED_SCALE, mask)
    return FAMILY.kernels().run_masked_scale(grad_output, mask, plan, scale, torch.empty_like(grad_output))


def _current_index(device_type: str) -> int | None:
    """The current device index of ``device_type``; None where the type has none (the CPU)."""
    current = None if device_type == "cpu" else getattr(getattr(torch, device_type, None), "current_device", None)
    return None if current is None else current()


def same_device(generator: torch.device, tensor: torch.device,
                current: Callable[[str], int | None] = _current_index) -> bool:
    """Whether a generator on ``generator`` draws for a tensor on ``tensor``: the same type and the
    same index, an index left unset meaning ``current(type)``. ``torch.Generator("cuda")`` reports
    ``cuda`` with no index, the current device, while a tensor there reports ``cuda:0``."""
    if generator.type != tensor.type:
        return False
    if generator.index == tensor.index:
        return True

    def index(d: torch.device) -> int | None:
        return current(d.type) if d.index is None else d.index

    return index(generator) == index(tensor)


def generator_fits(generator: torch.Generator | None, self: Tensor) -> bool:
    """No generator, or one on ``self``'s device (see ``same_device``): part of the layout key."""
    return generator is None or same_device(generator.device, self.device)


def bernoulli_plan_or_why(self: Tensor, p: float, *, generator: torch.Generator | None) -> ElementwisePlan | str:
    found = _p_why(p)
    if found:
        return found
    if not generator_fits(generator, self):
        return f"generator on {generator.device}, tensor on {self.device}"
    return why.elementwise(self) or plan_elementwise(self, _BERNOULLI)


def bernoulli_impl(self: Tensor, p: float, *, generator: torch.Generator | None,
                   plan: ElementwisePlan | None = None) -> Tensor:
    kernels = FAMILY.kernels()
    seed = kernels.draw_seed(self, generator)
    return kernels.run_bernoulli(self, plan or plan_elementwise(self, _BERNOULLI), seed, p)


# ``p`` enters the keys only as what the decisions read of it: plans hold nothing of its value.
FAMILY = Family(DSL_NAME, "dropout", [
    Op("native_dropout", dropout_plan_or_why, dropout_impl, ("input", "train is False", "0.0 <= p <= 1.0", "p == 1.0"),
       public_name="dropout", measured=False, options={"derive_variants": ("out",)}, bench=("dropout",)),
    Op("native_dropout_backward", dropout_backward_plan_or_why, dropout_backward_impl, ("grad_output", "mask"),
       public_name="dropout", backward=True, measured=False, options={"derive_variants": ("out",)},
       bench=("dropout",)),
    Op("bernoulli_.float", bernoulli_plan_or_why, bernoulli_impl,
       ("self", "0.0 <= p <= 1.0", "generator is None or generator_fits(generator, self)"), measured=False,
       bench=("dropout",)),
], kernels="dropout", names={"generator_fits": generator_fits})
