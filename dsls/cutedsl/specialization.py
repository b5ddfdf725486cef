"""What names one compiled program (no cutlass import): the ops pick specializations, the compiler builds them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

KERNELS = ("norm_forward", "norm_backward", "softmax_forward", "softmax_backward", "row_reduce")


@dataclass(frozen=True)
class Specialization:
    """One compiled program. ``flags`` are the compile-time switches of its kernel family
    (``rms``, ``weight``, ``bias``, ``log``; ``sum``, ``mean``, ``max`` or ``min`` for
    ``row_reduce``) and ``vec`` for 16-byte accesses."""

    kernel: str  # norm_forward, norm_backward, softmax_forward, softmax_backward, row_reduce
    dtype: str  # what the rows are read as
    out_dtype: str  # what the rows are written as
    threads: int
    flags: frozenset[str] = frozenset()

    def describe(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "dtype": self.dtype,
            "out_dtype": self.out_dtype,
            "threads": self.threads,
            "flags": sorted(self.flags),
        }

    def symbol(self) -> str:
        return "pn_" + hashlib.sha256(repr(sorted(self.describe().items())).encode()).hexdigest()[:20]
