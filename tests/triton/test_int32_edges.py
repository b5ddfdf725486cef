"""Launches planned at 2**31 elements: the kernels' int32 index arithmetic (the sites
``python -m python_native inspect`` reports, ``kernel_report.offsets``) stays below 2**31 in the
last program of every launch a cond accepts, and the conds decline one row or element past the
bound. The inputs are tensors without memory (a wrapper subclass carrying sizes and strides), so
nothing of that size is allocated; the conds plan them as they plan any tensor subclass.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import requires_triton

import python_native as pn  # noqa: F401  (first: registers the backend)
from python_native_dsls.triton.ops import families
from python_native_dsls.triton.plans.layout import MAX_INDEX

pytestmark = requires_triton

INT32_MAX = 2**31 - 1


class Sized(torch.Tensor):
    """A CPU tensor of any size with no memory: any op on it raises (only its metadata is read)."""

    @staticmethod
    def __new__(cls, *size: int, dtype: torch.dtype = torch.bfloat16):
        return torch.Tensor._make_wrapper_subclass(cls, size, dtype=dtype, device="cpu")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a sized stand-in has no data ({func})")


def _built(family: str, op: str):
    return next(f for f in families() if f.name == family)[op]


# op -> (family, op, call(rows, cols) -> args)
ROW_OPS = {
    "softmax": ("softmax", "_softmax", lambda r, c: (Sized(r, c), -1, False)),
    "log_softmax": ("softmax", "_log_softmax", lambda r, c: (Sized(r, c), -1, False)),
    "rms_norm": ("rms_norm", "_fused_rms_norm", lambda r, c: (Sized(r, c), [c], None, 1e-6)),
    "layer_norm": ("layer_norm", "native_layer_norm", lambda r, c: (Sized(r, c), [c], None, None, 1e-5)),
    "sum": ("reductions", "sum.dim_IntList", lambda r, c: (Sized(r, c), [1])),
    "amax": ("reductions", "amax", lambda r, c: (Sized(r, c), [1])),
}


def _last_row(plan) -> int:
    """The last row index the plan's last program forms (``program_id * BLOCK_M + BLOCK_M - 1``)."""
    if hasattr(plan, "first"):  # a reduction: its first stage's programs over the outer rows
        return (plan.first.grid[0] - 1) * plan.first.block_a + plan.first.block_a - 1
    return (plan.grid[0] - 1) * plan.block_m + plan.block_m - 1


@pytest.mark.parametrize("name", list(ROW_OPS))
def test_row_launches_at_the_bound_keep_their_row_indices_in_int32(name):
    family, op, call = ROW_OPS[name]
    built = _built(family, op)
    for cols in (1, 2):
        plan = built.cond(*call(MAX_INDEX, cols))
        assert plan is not None, built.explain(*call(MAX_INDEX, cols))
        assert _last_row(plan) <= INT32_MAX
    args = call(MAX_INDEX + 1, 1)
    assert built.cond(*args) is None
    assert "int32" in built.explain(*args)


def test_rows_far_past_the_bound_decline():
    """2**31 + 8 rows of one column: a last program whose first row would wrap to a negative int32."""
    for family, op, call in ROW_OPS.values():
        built = _built(family, op)
        assert built.cond(*call(2**31 + 8, 1)) is None, op


def test_elementwise_launch_at_the_bound_keeps_its_offsets_in_int32():
    built = _built("activations", "silu")
    plan = built.cond(Sized(MAX_INDEX))
    assert plan is not None
    per_program = -(-plan.n // plan.grid[0])
    block = 1 << (per_program - 1).bit_length()  # the launch's power-of-two block
    assert (plan.grid[0] - 1) * block + block - 1 <= INT32_MAX
    assert built.cond(Sized(MAX_INDEX + 1)) is None and "int32" in built.explain(Sized(MAX_INDEX + 1))


def test_in_row_offsets_past_the_bound_decline():
    """One row whose last column sits past 2**31 elements from its first: ``cols * stride`` is int32."""
    built = _built("softmax", "_softmax")
    wide = Sized(2, 2**20, dtype=torch.float32)
    strided = torch.Tensor._make_wrapper_subclass(Sized, (2, 2**20), strides=(1, 2**11 + 1), dtype=torch.float32,
                                                  device="cpu")
    assert built.cond(wide, -1, False) is not None
    assert built.cond(strided, -1, False) is None and "int32" in built.explain(strided, -1, False)


# op -> (family, op, call(rows) -> args over ``rows`` rows of one column, keyword arguments)
MORE_ROW_OPS = {
    "swiglu": ("gated", "swiglu", lambda r: (Sized(r, 1), Sized(r, 1)), {}),
    "topk": ("topk", "topk", lambda r: (Sized(r, 1), 1, -1, True, True), {}),
    "index_add": ("scatter_add", "index_add",
                  lambda r: (Sized(r, 1, dtype=torch.float32), 0, Sized(r, dtype=torch.int64),
                             Sized(r, 1, dtype=torch.float32)), {"alpha": 1}),
}


@pytest.mark.parametrize("name", list(MORE_ROW_OPS))
def test_other_row_launches_decline_past_the_row_bound(name):
    family, op, call, kw = MORE_ROW_OPS[name]
    built = _built(family, op)
    assert built.cond(*call(MAX_INDEX), **kw) is not None, built.explain(*call(MAX_INDEX), **kw)
    for rows in (MAX_INDEX + 1, 2**31 + 8):
        assert built.cond(*call(rows), **kw) is None
        assert "int32 row indices" in built.explain(*call(rows), **kw)
