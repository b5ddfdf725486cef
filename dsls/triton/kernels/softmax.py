"""Softmax and log-softmax over rows, forward and backward, launched along the ops' plans.

Rows up to ``MAX_ROW_BLOCK`` wide are held whole in registers, several short rows per program
(``softmax_rows``). Longer rows (vocabulary-sized log-softmax) take the paths of ``softmax_long``.
"""

from __future__ import annotations

import torch

from ..plans.rows import RowPlan
from . import softmax_long
from .softmax_rows import BWD, FWD


def run_forward(x: torch.Tensor, plan: RowPlan, log: bool, path: str = "auto") -> torch.Tensor:
    """(Log-)softmax of each row of ``x`` along a plan from ``ops.softmax`` (layout work done once
    per key): a contiguous tensor of the plan's output dtype shaped like ``x``. ``path`` picks the
    long-row path (``softmax_long.PATHS``); rows the packed kernels hold take those whatever it is."""
    rows, _, out_dtype, fresh_like, looped, grid, num_warps, block_m, block_n, serial = plan
    if looped:
        return softmax_long.forward(x, rows, out_dtype, log, path).view(x.shape)
    if fresh_like:
        y = torch.empty_like(x)
    else:
        y = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    FWD.planned(serial + log, grid, (x, y, *rows), num_warps, log, block_m, block_n)
    return y


def run_backward(dy: torch.Tensor, y: torch.Tensor, plan: RowPlan, log: bool, path: str = "auto") -> torch.Tensor:
    """Input gradient of (log-)softmax from its output ``y``, along a plan from ``ops.softmax``:
    a contiguous tensor shaped like ``y``."""
    rows, grad_rows, out_dtype, fresh_like, looped, grid, num_warps, block_m, block_n, serial = plan
    if looped:
        return softmax_long.backward(dy, grad_rows, y, rows, out_dtype, log, path).view(y.shape)
    if fresh_like:
        dx = torch.empty_like(y)
    else:
        dx = torch.empty_like(y, dtype=out_dtype, memory_format=torch.contiguous_format)
    n_rows, n_cols, row_stride, col_stride = rows
    BWD.planned(
        serial + log, grid,
        (dy, y, dx, n_rows, n_cols, grad_rows.row_stride, grad_rows.col_stride, row_stride, col_stride),
        num_warps, log, block_m, block_n,
    )
    return dx
