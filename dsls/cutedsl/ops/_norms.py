"""What the layer norm and RMS norm families share around the one CuTe DSL norm kernel: the
backward's per-CTA weight/bias partial sums, and the specializations built ahead of time."""

from __future__ import annotations

import torch

from ..specialization import Specialization
from ._rows import DTYPE_NAMES, SIZE_CLASSES, Rows, placeholder, threads_of


def partial_sums(input: torch.Tensor, rows: Rows, n_ctas: int, param: torch.Tensor | None) -> torch.Tensor:
    """The zeroed ``[n_ctas, n_cols]`` fp32 buffer the backward kernel adds ``param``'s gradient
    into, one row per CTA; a placeholder when there is no such parameter (nothing is written)."""
    if param is None:
        return placeholder(input, torch.float32, 2)
    return torch.zeros((n_ctas, rows.n_cols), device=input.device, dtype=torch.float32)


def param_grad(part: torch.Tensor, param: torch.Tensor | None, wanted: bool) -> torch.Tensor | None:
    """``param``'s gradient from the CTAs' partial rows, in its shape and dtype; None when not wanted."""
    if not wanted or param is None:
        return None
    return part.sum(0).view(param.shape).to(param.dtype)


def norm_specializations(forward: str, backward: str, flag_sets: tuple[tuple[str, ...], ...]) -> list[tuple[str, str, object]]:
    """``(op, size class, specialization)`` for every dtype, size class and set of kernel flags:
    the forward also vectorized, the backward as is."""
    out: list[tuple[str, str, object]] = []
    for dtype in DTYPE_NAMES.values():
        for cls, _, _ in SIZE_CLASSES:
            for flags in flag_sets:
                for vec in ((), ("vec",)):
                    specialization = Specialization("norm_forward", dtype, dtype, threads_of(cls), frozenset(flags + vec))
                    out.append((forward, cls, specialization))
                specialization = Specialization("norm_backward", dtype, dtype, threads_of(cls), frozenset(flags))
                out.append((backward, cls, specialization))
    return out
