"""Turn Python numbers that arrived in Tensor parameters back into tensors for aten's kernels.

aten accepts ``x * 2`` by wrapping the 2 into a "wrapped number" tensor above the dispatcher, and
the dispatcher hands a Python kernel the plain number again. The captured kernel only takes
tensors there, so the fallback path rebuilds one, choosing its dtype so that type promotion gives
what the wrapped number would have given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

_WIDE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}


def _category(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 0 if dtype == torch.bool else 1


def coerce(value: Any, peers: Iterable[Any]) -> Any:
    """``value`` as a 0-dim tensor that promotes like aten's wrapped number would, next to ``peers``."""
    kind = type(value)
    if kind not in _WIDE:
        return value  # a tensor, None, or something aten will reject with its own error
    peer = next((p for p in peers if isinstance(p, torch.Tensor)), None)
    if peer is None:
        return torch.tensor(value)
    if peer.dim() > 0 and _CATEGORY[kind] <= _category(peer.dtype):
        # The dimensioned peer decides the dtype; keep the number at full width, as aten does.
        dtype = _WIDE[kind]
    else:
        dtype = torch.result_type(peer, value)
    return torch.tensor(value, dtype=dtype, device="cpu")
