"""``topk`` (and its ``out=`` form ``topk.values``, derived) on the Triton top-k kernels.

What the override guarantees, against aten's contract:

- values equal aten's, in aten's order when ``sorted=True`` (largest or smallest first); NaN ranks
  above +inf, as in aten, so it comes first for ``largest=True`` and last for ``largest=False``;
- indices are int64 and name elements holding those values. Among equal values (ties, NaNs, -0.0
  and 0.0, which compare equal) aten's kernels pick any; these pick the lowest index first, so
  index and gradient placement can differ from aten's exactly where aten leaves it open;
- ``sorted=False`` returns the same sorted order: torch promises no order then.

Accepted: float32/float16/bfloat16 on the backend's device, ``1 <= k <= min(size, K_MAX)`` (1024),
a dim whose leading and trailing dims each collapse to one strided axis (any dim of a contiguous
tensor, transposed and sliced rows). Declined: other dtypes, 0-dim and empty inputs, larger k,
SymInt k, layouts that do not collapse.
"""

from __future__ import annotations

import torch

from python_native_dsls.family import Family, Op
from python_native_dsls.proving import FORWARD, BenchRow, Driver, LlmCase, Sample, Tensors, rand

from ..plans.select import TopkPlan, rows_along, topk_plan
from ..target import DSL_NAME
from . import why

Tensor = torch.Tensor


def topk_plan_or_why(self: Tensor, k: int, dim: int, largest: bool, sorted: bool) -> TopkPlan | str:
    """The launch plan where the kernels take the call, else why not (metadata only)."""
    if k.__class__ is not int:  # a SymInt while tracing
        return f"k is a {k.__class__.__name__} (the kernels take a plain int k)"
    found = why.device(self) or why.dtype(self)
    if found:
        return found
    if self.ndim == 0:
        return "a 0-d input"
    if not -self.ndim <= dim < self.ndim:
        return f"dim {dim} is out of range for a {self.ndim}-d input"
    dim %= self.ndim
    shape = tuple(self.shape)
    rows = rows_along(shape, tuple(self.stride()), dim)
    if rows is None:
        return f"layout: the dims before dim {dim} or those after it do not collapse to one strided axis"
    return topk_plan(rows, k, bool(largest), shape[:dim] + (k,) + shape[dim + 1 :])


def topk_impl(self: Tensor, k: int, dim: int, largest: bool, sorted: bool,
              plan: TopkPlan | None = None) -> tuple[Tensor, Tensor]:
    if plan is None:
        plan = topk_plan_or_why(self, k, dim, largest, sorted)
        if plan.__class__ is str:
            raise ValueError(f"topk: the Triton kernels do not take k={k}, dim={dim} for a {self.dtype} tensor of "
                             f"shape {tuple(self.shape)} and strides {self.stride()}: {plan}")
    return FAMILY.kernels().run_topk(self, plan)


def _cases(dtype: torch.dtype, device: str):
    """``verify``'s cases: both paths (k up to 32, and the sorting one), NaN and infinities, any dim."""
    x = rand(6, 100, dtype=dtype, device=device)
    yield Sample("k=8 largest", lambda t: torch.topk(t, 8).values, [x])
    yield Sample("k=40 smallest (sorting path)", lambda t: torch.topk(t, 40, largest=False).values, [x])
    # sorted=False promises no order: compare the sets, as sorted lists.
    yield Sample("unsorted", lambda t: torch.topk(t, 8, sorted=False).values.sort(-1, descending=True).values, [x])
    special = rand(3, 50, dtype=dtype, device=device)
    special[0, 3] = special[1, :10] = float("nan")
    special[0, 7], special[2, 1], special[2, 2] = float("inf"), float("-inf"), -0.0
    yield Sample("NaN and inf, largest", lambda t: torch.topk(t, 12).values, [special])
    yield Sample("NaN and inf, smallest", lambda t: torch.topk(t, 45, largest=False).values, [special])
    yield Sample("transposed", lambda t: torch.topk(t, 3, dim=1).values, [rand(33, 4, dtype=dtype, device=device).t()])
    yield Sample("middle dim", lambda t: torch.topk(t, 4, dim=1).values, [rand(4, 10, 5, dtype=dtype, device=device)])
    yield Sample("wide row, chunked", lambda t: torch.topk(t, 8).values, [rand(1, 9000, dtype=dtype, device=device)])


def _row_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> Tensors:
    """Rows x cols values ``x``, of which each row's ``k`` largest are picked (the row's shape: rows, cols, k)."""
    rows, cols, k = shape
    return {"x": torch.randn(rows, cols, device=device, dtype=dtype), "k": k, "leaves": [], "dy": None}


# Forward only: x read, k values and their int64 indices written per row. LLM rows: sampling from a
# Llama-3 vocabulary (one sequence, a batch of 64) and MoE routing (4096 tokens, 8 of 4096 experts).
_ROW = BenchRow("topk", ((4, 64, 4), (7, 100, 20)),
                ((4096, 4096, 8), (8192, 4096, 8), (4096, 32000, 50), (64, 128256, 256)),
                _row_inputs, lambda t: torch.topk(t["x"], t["k"]).values,
                lambda shape, mode, itemsize: shape[0] * (shape[1] * itemsize + shape[2] * (itemsize + 8)),
                modes=FORWARD,
                llm=(*(LlmCase("fwd", s) for s in ((1, 128256, 50), (1, 128256, 256), (64, 128256, 50),
                                                   (4096, 4096, 8))),
                     *(LlmCase("fwd", s, torch.float32) for s in ((1, 128256, 50), (4096, 4096, 8)))))


# A SymInt ``k`` comes with FakeTensors (tracing), which are planned directly: no key holds it.
FAMILY = Family(DSL_NAME, "topk", [
    Op("topk", topk_plan_or_why, topk_impl, ("self", "k", "dim", "largest"), measured=False,
       options={"derive_forms": ("out",)}, bench_rows=(_ROW,), verify=Driver(_cases, ("topk",))),
], kernels="topk")
