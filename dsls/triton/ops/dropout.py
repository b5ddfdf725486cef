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
``bernoulli_.float`` takes a generator on the tensor's device or none.
"""

from __future__ import annotations

import functools
import struct
from types import ModuleType

import torch

from python_native.foundations.speckey import MISSING, SpecializationCache
from python_native_dsls.layout import FLOAT_DTYPES
from python_native_dsls.spec import OverrideSpec

from ..plans.elementwise import ElementwisePlan, plan_elementwise
from ..plans.layout import backend_device, dense_like, fits_index, on_backend
from . import why

Tensor = torch.Tensor
_DROPOUT, _BERNOULLI, _MASKED_SCALE = 0, 1, 2  # kernel variants, part of each launch key


@functools.cache
def _kernels() -> ModuleType:
    """The kernel module, imported (with triton) on the first launch rather than with the op."""
    from python_native_dsls.triton.kernels import dropout

    return dropout


def _plan(x: Tensor, variant: int) -> ElementwisePlan | None:
    ok = on_backend(x) and x.dtype in FLOAT_DTYPES and fits_index(x) and dense_like(x)
    return plan_elementwise(x, variant) if ok else None


def _backward_plan(grad: Tensor, mask: Tensor) -> ElementwisePlan | None:
    if not (on_backend(grad, mask) and grad.dtype in FLOAT_DTYPES and mask.dtype == torch.bool):
        return None
    if not (fits_index(grad) and dense_like(grad, mask)):
        return None
    if backend_device() == "cuda" and not _suggested_format_dense(grad):
        return None
    return plan_elementwise(grad, _MASKED_SCALE, mask)


def _suggested_format_dense(t: Tensor) -> bool:
    """``t`` is dense in ``suggest_memory_format(t)``: ``empty_like(t, memory_format=...)``, what aten's
    CUDA kernel allocates, is then ``t``'s own layout."""
    from torch._prims_common import suggest_memory_format

    return t.is_contiguous(memory_format=suggest_memory_format(t))


_PLANS: SpecializationCache[ElementwisePlan | None] = SpecializationCache(_plan, 4096)
_BACKWARD_PLANS: SpecializationCache[ElementwisePlan | None] = SpecializationCache(_backward_plan, 4096)
_lookup = _PLANS.lookup
_backward_lookup = _BACKWARD_PLANS.lookup


def flat_plan(x: Tensor, variant: int) -> ElementwisePlan | None:
    """The flat launch over ``x`` where the kernels take it, else None; cached per layout."""
    if x.__class__ is not Tensor:
        return _plan(x, variant)
    key = (x.size(), x.stride(), x.dtype, x.is_cuda, x.is_cpu, variant)
    plan = _lookup(key, MISSING)
    return _PLANS.get(key, x, variant) if plan is MISSING else plan


def backward_plan(grad: Tensor, mask: Tensor) -> ElementwisePlan | None:
    if grad.__class__ is not Tensor or mask.__class__ is not Tensor:
        return _backward_plan(grad, mask)
    key = (grad.size(), grad.stride(), grad.dtype, grad.is_cuda, grad.is_cpu,
           mask.size(), mask.stride(), mask.dtype, mask.is_cuda, mask.is_cpu)
    plan = _backward_lookup(key, MISSING)
    return _BACKWARD_PLANS.get(key, grad, mask) if plan is MISSING else plan


def _fp32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def dropout_scale(p: float, cuda: bool) -> float:
    """aten's ``1 / (1 - p)``: in double on CPU (0 at ``p = 1``); on CUDA of ``1 - p`` rounded to
    fp32 first. The kernel rounds it to fp32 either way."""
    keep = 1.0 - p
    if cuda:
        return 1.0 / _fp32(keep)
    return 0.0 if keep == 0 else 1.0 / keep


def dropout_cond(input: Tensor, p: float, train: bool | None) -> ElementwisePlan | None:
    """The plan where the kernel takes the call, else None (handed to the impl as ``plan``)."""
    if train is False or not 0.0 <= p <= 1.0 or (p == 1.0 and backend_device() == "cuda"):
        return None
    return flat_plan(input, _DROPOUT)


def dropout_impl(input: Tensor, p: float, train: bool | None, plan: ElementwisePlan | None = None) -> tuple[Tensor, Tensor]:
    kernels = _kernels()
    seed = kernels.draw_seed(input)
    return kernels.run_dropout(input, plan or plan_elementwise(input, _DROPOUT), seed, p,
                               dropout_scale(p, input.is_cuda))


def dropout_backward_cond(grad_output: Tensor, mask: Tensor, scale: float) -> ElementwisePlan | None:
    return backward_plan(grad_output, mask)


def dropout_backward_impl(grad_output: Tensor, mask: Tensor, scale: float, plan: ElementwisePlan | None = None) -> Tensor:
    plan = plan or plan_elementwise(grad_output, _MASKED_SCALE, mask)
    return _kernels().run_masked_scale(grad_output, mask, plan, scale, torch.empty_like(grad_output))


def dropout_explain(input: Tensor, p: float, train: bool | None) -> str | None:
    """Why ``dropout_cond`` declined (asked by traced calls only)."""
    if train is False:
        return "train=False: aten returns a copy and an all-True mask, nothing random to draw"
    if not 0.0 <= p <= 1.0:
        return f"p = {p} is outside [0, 1]"
    if p == 1.0 and backend_device() == "cuda":
        return "p = 1 at the CUDA key: aten returns zeros without drawing (ours would keep a NaN as NaN)"
    return why.elementwise(input)


def dropout_backward_explain(grad_output: Tensor, mask: Tensor, scale: float) -> str | None:
    """Why ``dropout_backward_cond`` declined."""
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
    return None


def bernoulli_explain(self: Tensor, p: float, *, generator: torch.Generator | None) -> str | None:
    """Why ``bernoulli_cond`` declined."""
    if not 0.0 <= p <= 1.0:
        return f"p = {p} is outside [0, 1]"
    if generator is not None and generator.device != self.device:
        return f"generator on {generator.device}, tensor on {self.device}"
    return why.elementwise(self)


def bernoulli_cond(self: Tensor, p: float, *, generator: torch.Generator | None) -> ElementwisePlan | None:
    if not 0.0 <= p <= 1.0 or (generator is not None and generator.device != self.device):
        return None
    return flat_plan(self, _BERNOULLI)


def bernoulli_impl(self: Tensor, p: float, *, generator: torch.Generator | None,
                   plan: ElementwisePlan | None = None) -> Tensor:
    kernels = _kernels()
    seed = kernels.draw_seed(self, generator)
    return kernels.run_bernoulli(self, plan or plan_elementwise(self, _BERNOULLI), seed, p)


OVERRIDES = [
    OverrideSpec.planned("native_dropout", dropout_cond, dropout_impl, measured=False, public_name="dropout",
                         derive_variants=("out",), explain=dropout_explain),
    OverrideSpec.planned("native_dropout_backward", dropout_backward_cond, dropout_backward_impl, measured=False,
                         public_name="dropout", backward=True, derive_variants=("out",),
                         explain=dropout_backward_explain),
    OverrideSpec.planned("bernoulli_.float", bernoulli_cond, bernoulli_impl, measured=False, explain=bernoulli_explain),
]
