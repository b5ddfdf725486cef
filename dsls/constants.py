"""Facts both backends' ops and kernels read, defined once: aten's defaults and the device's SM count.

Backend-neutral and light (torch only, no DSL import, CUDA queried only when asked).
"""

from __future__ import annotations

import functools

import torch

# aten's epsilon of ``rms_norm`` when ``eps`` is None: that of the fp32 accumulation type.
DEFAULT_EPS = torch.finfo(torch.float32).eps


@functools.lru_cache(maxsize=16)
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (what persistent grids are sized by)."""
    return torch.cuda.get_device_properties(index).multi_processor_count
