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

Verify judges dropout by structure (``dropout_structure``), the random streams differing from aten's:
every element kept (output ``x * scale``, gradient ``grad * scale``) or dropped (both zero; a dropped
NaN or infinity gives NaN), with one scale, aten's where aten kept anything and ``1 / (1 - p)`` where
``p`` is known, and on large tensors a kept fraction within six standard deviations of ``1 - p``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from python_native.foundations.tolerances import TOLERANCES
from python_native_dsls.bench_cases import IO_BYTES
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import BOTH, BenchRow, Driver, LlmCase, Sample, rand, x_input

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


def _dropout_inputs(dtype: torch.dtype, device: str) -> list[tuple[str, torch.Tensor, float]]:
    special = rand(8, 16, dtype=dtype, device=device)
    special[0, :4] = float("nan")
    special[1, :4] = float("inf")
    return [
        ("2-D", rand(16, 100, dtype=dtype, device=device), 0.3),
        ("channels_last", rand(2, 8, 5, 5, dtype=dtype, device=device).contiguous(memory_format=torch.channels_last),
         0.5),
        ("transposed", rand(30, 20, dtype=dtype, device=device).t(), 0.2),
        ("NaN and inf entries", special, 0.5),
        ("large: kept fraction", rand(128, 256, dtype=dtype, device=device), 0.25),
    ]


def _dropout_cases(native_first: bool):
    """``F.dropout`` (and ``F.dropout2d``) cases, and direct ``torch.native_dropout`` calls, which
    reach ``native_dropout`` on every device (``F.dropout`` does only on GPUs)."""

    def cases(dtype: torch.dtype, device: str):
        native, public = [], []
        for name, x, p in _dropout_inputs(dtype, device):
            native.append(Sample(f"native_dropout {name}", lambda t, _p=p: torch.native_dropout(t, _p, True)[0],
                                 [x], {"p": p}))
            public.append(Sample(f"F.dropout {name}", lambda t, _p=p: F.dropout(t, _p, True), [x], {"p": p}))
        x = rand(4, 6, 3, 3, dtype=dtype, device=device)
        public.append(Sample("F.dropout2d", lambda t: F.dropout2d(t, 0.5, True), [x], {"p": 0.5}))
        x = rand(6, 7, dtype=dtype, device=device)
        native += [Sample("native_dropout p=0", lambda t: torch.native_dropout(t, 0.0, True)[0], [x], {"p": 0.0}),
                   Sample("native_dropout train=None", lambda t: torch.native_dropout(t, 0.4, None)[0], [x],
                          {"p": 0.4})]
        first, second = (native, public) if native_first else (public, native)
        for pair in zip(first, second, strict=False):
            yield from pair
        longer = first if len(first) > len(second) else second
        yield from longer[min(len(first), len(second)):]

    return cases


def _ratio(num: torch.Tensor, den: torch.Tensor, where: torch.Tensor) -> float | None:
    """The median of ``num / den`` over ``where`` (finite, non-zero ``den``), or None where there is none."""
    where = where & torch.isfinite(den) & (den != 0) & torch.isfinite(num)
    return float((num[where] / den[where]).median()) if bool(where.any()) else None


def _judge(x: torch.Tensor, run: Any, dtype: torch.dtype) -> tuple[float | None, float | None, torch.Tensor, list[str]]:
    """``(output scale, gradient scale, kept, problems)`` of one run: the mask read off the input
    gradient (the output cannot tell a dropped zero from a kept one), each scale off the kept
    elements. The two scales differ where aten's derivative says so (``train=None``: 1)."""
    y = run.out.double()
    grad = None if run.grads[0] is None or run.grad_out is None else run.grads[0].double()
    kept = (grad != 0) if grad is not None else (y != 0)
    rtol, atol = TOLERANCES.get(dtype, (1e-7, 1e-7))
    problems: list[str] = []
    scale = _ratio(y, x, kept)
    if scale is not None:
        near = torch.isclose(y, x * scale, rtol=rtol, atol=atol, equal_nan=True)
        if not bool(near[kept].all()):
            problems.append(f"{int((~near[kept]).sum())} kept elements are not x * {scale:.6g}")
    grad_scale = None
    if grad is not None:
        g = run.grad_out.double()
        grad_scale = _ratio(grad, g, kept)
        if grad_scale is not None:
            near = torch.isclose(grad, g * grad_scale, rtol=rtol, atol=atol)
            if not bool(near[kept].all()):
                problems.append(f"{int((~near[kept]).sum())} kept gradients are not grad * {grad_scale:.6g}")
    dropped_ok = (y == 0) | (~torch.isfinite(x) & y.isnan())
    if not bool(dropped_ok[~kept].all()):
        problems.append(f"{int((~dropped_ok[~kept]).sum())} dropped elements are not zero")
    return scale, grad_scale, kept, problems


def _off(what: str, got: float | None, expected: float | None, rtol: float) -> list[str]:
    if got is None or expected is None or abs(got - expected) <= 2 * rtol * abs(expected):
        return []
    return [f"{what} {got:.6g}, expected {expected:.6g}"]


def dropout_structure(sample: Sample, got: Any, ref: Any) -> list[str]:
    """What is wrong with a dropout run (``got``) next to aten's (``ref``); empty when nothing is."""
    if got.out.shape != ref.out.shape or got.out.dtype != ref.out.dtype:
        return [f"output: {tuple(got.out.shape)}/{got.out.dtype} vs aten {tuple(ref.out.shape)}/{ref.out.dtype}"]
    x = sample.inputs[0].detach().double()
    dtype = got.out.dtype
    scale, grad_scale, kept, problems = _judge(x, got, dtype)
    ref_scale, ref_grad_scale, _, _ = _judge(x, ref, dtype)
    rtol = TOLERANCES.get(dtype, (1e-7, 0.0))[0]
    p, training = sample.meta.get("p", 0.5), sample.meta.get("training", True)
    expected = ref_scale
    if "p" in sample.meta or "training" in sample.meta:
        expected = 1.0 if not training or p == 0 else (None if p == 1 else 1.0 / (1.0 - p))
    problems += _off("scale", scale, expected, rtol)
    problems += _off("gradient scale", grad_scale, ref_grad_scale if ref_grad_scale is not None else expected, rtol)
    if training and p == 1 and bool(kept.any()):
        problems.append("p=1 kept elements")
    n = kept.numel()
    if "p" in sample.meta and n >= 4096 and training:
        spread = 6 * math.sqrt(p * (1 - p) / n) + 1 / n
        fraction = float(kept.double().mean())
        if abs(fraction - (1 - p)) > spread:
            problems.append(f"kept fraction {fraction:.4f}, expected {1 - p:.4f} +- {spread:.4f}")
    return problems


# Bench drops with p = 0.1 in training mode; besides x and y it moves a one-byte mask, written by
# the forward and read back by the backward.
_ROW = BenchRow("dropout", ((4, 64),), ((4096, 4096), (16384, 5120)), x_input(),
                lambda t: F.dropout(t["x"], 0.1, training=True),
                lambda shape, mode, itemsize: IO_BYTES(shape, mode, itemsize)
                + math.prod(shape) * (1 if mode == "fwd" else 2),
                llm=tuple(LlmCase(mode, (8192, 4096), dtype) for mode in BOTH
                          for dtype in (torch.bfloat16, torch.float32)))


# ``p`` enters the keys only as what the decisions read of it: plans hold nothing of its value.
FAMILY = Family(DSL_NAME, "dropout", [
    Op("native_dropout", dropout_plan_or_why, dropout_impl, ("input", "train is False", "0.0 <= p <= 1.0", "p == 1.0"),
       public_name="dropout", measured=False, options={"derive_forms": ("out",)}, bench_rows=(_ROW,),
       verify=Driver(_dropout_cases(native_first=True), ("nn.functional.dropout",), ("native_dropout_backward",),
                     dropout_structure)),
    Op("native_dropout_backward", dropout_backward_plan_or_why, dropout_backward_impl, ("grad_output", "mask"),
       public_name="dropout", backward=True, measured=False, options={"derive_forms": ("out",)},
       bench=("dropout",)),
    Op("bernoulli_.float", bernoulli_plan_or_why, bernoulli_impl,
       ("self", "0.0 <= p <= 1.0", "generator is None or generator_fits(generator, self)"), measured=False,
       bench=("dropout",), verify=Driver(_dropout_cases(native_first=False), ("nn.functional.dropout",
                                         "nn.functional.dropout2d", "nn.functional.dropout3d"), (), dropout_structure)),
], kernels="dropout", names={"generator_fits": generator_fits})
