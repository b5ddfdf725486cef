"""Launches planned at 2**31 elements: the kernels' int32 index arithmetic (the sites
``python -m python_native inspect`` reports, ``kernel_report.offsets``) stays below 2**31 in the
last program of every launch a cond accepts, and the conds decline one row or element past the
bound. The inputs are tensors without memory (a wrapper subclass carrying sizes and strides), so
nothing of that size is allocated; the conds plan them as they plan any tensor subclass. They sit
on the kernels' device (the conds decline any other), which needs no memory there either.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import DEVICE, requires_triton

import python_native as pn  # noqa: F401  (first: registers the backend)
from python_native_dsls.triton.ops import families
from python_native_dsls.triton.plans.layout import MAX_INDEX

pytestmark = requires_triton

INT32_MAX = 2**31 - 1
# The kernels' device, with the index a tensor there reports (no memory is allocated on it).
ON = torch.device(DEVICE, torch.cuda.current_device()) if DEVICE == "cuda" else torch.device(DEVICE)


class Sized(torch.Tensor):
    """A tensor on the kernels' device of any size with no memory: any op on it raises (only its
    metadata is read)."""

    @staticmethod
    def __new__(cls, *size: int, dtype: torch.dtype = torch.bfloat16):
        return torch.Tensor._make_wrapper_subclass(cls, size, dtype=dtype, device=ON)

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
                                                  device=ON)
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


def _strided(size: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    return torch.Tensor._make_wrapper_subclass(Sized, size, strides=strides, dtype=torch.bfloat16, device=ON)


def test_rotary_declines_offsets_past_the_bound():
    """Positions times cos's strides and head-dim columns times q's last stride are int32 in the kernel."""
    built = _built("rotary", "rotary")
    q = k = Sized(1, 2, 4, 64)
    cos = sin = Sized(1, 4, 64)
    assert built.cond(q, k, cos, sin, 1) is not None
    wide_cos = _strided((1, 4, 64), (0, MAX_INDEX // 3 + 1, 1))  # positions 3 apart past the bound
    assert built.cond(q, k, wide_cos, wide_cos, 1) is None
    assert "cos spans more than" in built.explain(q, k, wide_cos, wide_cos, 1)
    wide_q = _strided((1, 2, 4, 64), (512, 256, 64, 2**26))  # 63 columns 2**26 apart: past 2**31
    assert built.cond(wide_q, wide_q, cos, sin, 1) is None
    assert "head dim spans more than" in built.explain(wide_q, wide_q, cos, sin, 1)


@pytest.mark.parametrize("op", ["native_dropout", "bernoulli_.float"])
def test_dropout_launches_at_the_bound_keep_their_offsets_in_int32(op):
    built = _built("dropout", op)
    call = (lambda x: ((x, 0.5, True), {})) if op == "native_dropout" else (lambda x: ((x, 0.5), {"generator": None}))
    args, kw = call(Sized(MAX_INDEX, dtype=torch.float32))
    assert built.cond(*args, **kw) is not None
    args, kw = call(Sized(MAX_INDEX + 1, dtype=torch.float32))
    assert built.cond(*args, **kw) is None and "int32" in built.explain(*args, **kw)


def test_outer_product_grids_past_the_bound_decline():
    built = _built("bmm", "bmm")
    small = built.cond(Sized(2, 4096, 1), Sized(2, 1, 4096))
    assert small is not None and small.grid[0] <= MAX_INDEX
    a, b = Sized(1, 2**22, 1), Sized(1, 1, 2**22)  # 2**44 outputs: more tiles than int32 program ids
    assert built.cond(a, b) is None and "int32" in built.explain(a, b)


def test_topk_output_offsets_past_the_bound_decline():
    built = _built("topk", "topk")
    assert built.cond(Sized(2, 8, 2**20), 4, 1, True, True) is not None
    x = Sized(1, 8, 2**29)  # k x inner = 8 x 2**29 = 2**32
    assert built.cond(x, 8, 1, True, True) is None and "int32 output offsets" in built.explain(x, 8, 1, True, True)


def test_group_norm_launches_past_the_bound_decline():
    """Statistics rows (N x group), channel partials (N x C x splits) and grids are int32 in the kernels."""
    built = _built("group_norm", "native_group_norm")

    def call(n: int, c: int, hw: int, groups: int):
        return Sized(n, c, hw), Sized(c), Sized(c), n, c, hw, groups, 1e-5

    plan = built.cond(*call(8, 32, 1024, 8))
    assert plan is not None
    many = call(2**26, 32, 1, 32)  # 2**31 statistics rows: each sample small, the sum past int32
    assert built.cond(*many) is None and "int32" in built.explain(*many)
