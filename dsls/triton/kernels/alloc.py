"""Output allocation for the kernels, at the cost of one ``torch.empty_like``.

From Python, ``new_empty(shape, dtype=...)`` costs about half as much again as ``empty_like``
(its shape and options are parsed per call). ``empty_like`` of a cached one-element tensor
expanded to the wanted shape allocates the same contiguous tensor: an expanded tensor is not dense,
so ``empty_like`` lays its result out row-major.
"""

from __future__ import annotations

import torch

# (device index, dtype, shape) -> a one-element tensor expanded to that shape.
_TEMPLATES: dict[tuple, torch.Tensor] = {}
_MAX_TEMPLATES = 1024


def new_contiguous(like: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``shape`` and ``dtype`` on ``like``'s device."""
    key = (like.get_device(), dtype, shape)
    template = _TEMPLATES.get(key)
    if template is None:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.clear()
        template = _TEMPLATES[key] = like.new_empty((1,) * len(shape), dtype=dtype).expand(shape)
    return torch.empty_like(template)
