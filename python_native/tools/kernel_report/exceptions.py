"""Every kernel the checks of ``checks`` excuse, with the reason and what it costs, in one place.

An entry names the check it excuses, the kernel (for ``traffic``: the aten op's symbol), and where it
applies: a dtype and a row label prefix (``None``: every one). ``cost`` is what the report measured,
so that an entry is revisited when the figure moves; ``check`` flags an entry that no longer matches.
An ``int32`` entry names the cond's bound that keeps the kernel's int32 sites (``offsets``) below
2**31, optionally one site (the start of its source line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Excuse:
    check: str  # spill | traffic | warps | int32 | unmeasured
    kernel: str
    reason: str
    cost: str
    dtype: str | None = None
    label: str | None = None  # a prefix of the row's label, e.g. "softmax fwd+bwd 4096x32000"
    site: str | None = None  # int32: the start of the source line it excuses (None: every one of the kernel)

    def matches(self, finding: Any) -> bool:
        """Whether this entry is about ``finding`` (a ``checks.Finding``), wherever it applies."""
        return (self.check == finding.check and self.kernel == finding.kernel
                and (self.site is None or finding.measured.startswith(self.site)))

    def covers(self, label: str, dtype: str) -> bool:
        return (self.dtype is None or self.dtype == dtype) and (self.label is None or label.startswith(self.label))

    def scope(self) -> str:
        return " ".join(filter(None, [self.label or "every row", self.dtype or "every dtype"]))


def _bounded(kernels: tuple[str, ...], bound: str, site: str | None = None) -> tuple[Excuse, ...]:
    """``int32`` entries: the kernels' int32 index arithmetic stays below 2**31 because the conds
    decline every call past ``bound`` (``tests/triton/test_int32_edges.py`` plans launches there)."""
    return tuple(Excuse("int32", k, reason=bound, cost="none within the bound: calls past it go to aten", site=site)
                 for k in kernels)


_ROWS = ("the conds take at most MAX_INDEX (2**31 - 2**20) rows, and rows whose in-row offsets "
         "(n_cols - 1) * col_stride stay within MAX_INDEX (plans.layout.row_fits, plans.elementwise.plan_rows): "
         "program_id * BLOCK_M, a slice's first column and cols * col_stride stay below 2**31; row indices are "
         "widened to int64 before their product with the row stride")


def int32_bounds() -> tuple[Excuse, ...]:
    """The kernels whose int32 sites (``offsets``) their conds' bounds keep below 2**31."""
    return (
        *_bounded(("_softmax_fwd_kernel", "_softmax_bwd_kernel", "_softmax_slice_stats_kernel",
                   "_softmax_slice_write_kernel", "_norm_fwd_kernel", "_norm_bwd_rows_kernel",
                   "_norm_bwd_row_sums_kernel", "_norm_bwd_cols_kernel", "_column_sum_kernel", "_rows_fwd_kernel",
                   "_rows_bwd_kernel"), _ROWS),
        *_bounded(("_rows_kernel", "_cols_kernel"),
                  "plans.reduce.reduce_plan declines more than MAX_INDEX (2**31 - 2**20) outer rows or reduced "
                  "elements, and in-row or inner offsets (n - 1) * stride past MAX_INDEX: program ids times "
                  "blocks, slice bounds and offsets within a row or across the inner columns stay below 2**31"),
        *_bounded(("_act_fwd_kernel", "_act_bwd_kernel"),
                  "the flat elementwise launch takes at most MAX_INDEX (2**31 - 2**20) elements (ops.why: "
                  "'elements exceed int32 indexing'): program_id * BLOCK + arange stays below 2**31"),
        *_bounded(("_bernoulli_kernel",),
                  "dropout and bernoulli_ take at most MAX_INDEX (2**31 - 2**20) elements (ops.why: 'elements "
                  "exceed int32 indexing'): program_id * BLOCK plus the four quarters of a block stay below 2**31"),
        *_bounded(("_rotary_kernel",),
                  "ops.rotary declines cos or sin spanning more than MAX_INDEX (2**31 - 2**20) elements and a q or "
                  "k head dim whose columns span more: positions times cos's strides and columns times the head "
                  "dim's stride stay below 2**31; heads are widened to int64"),
        *_bounded(("_gn_stats_kernel", "_gn_normalize_kernel", "_gn_bwd_sums_kernel", "_gn_bwd_coeffs_kernel",
                   "_gn_bwd_params_kernel", "_gn_bwd_dx_kernel"),
                  "plans.group_norm declines samples whose in-sample offsets pass MAX_INDEX (2**31 - 2**20), and "
                  "calls whose statistics (4 x N x group x splits), channel partials (2 x N x C x splits) or grids "
                  "pass it: channel, position, statistics-row and partial indices stay below 2**31; samples are "
                  "widened to int64"),
        *_bounded(("_scatter_add_kernel",),
                  "plans.scatter.scatter_plan declines more than MAX_INDEX (2**31 - 2**20) rows of the iteration "
                  "space and more than MAX_INNER columns: the int32 tile indices stay below 2**31 before the "
                  "kernel widens them"),
        *_bounded(("_topk_kernel",),
                  "plans.select declines more than MAX_COLS (2**31 - 2**20) rows or columns: a program's rows "
                  "(before they are widened) and a chunk's columns stay below 2**31", site="rows = "),
        *_bounded(("_topk_kernel",), "as rows: columns are at most MAX_COLS (2**31 - 2**20)", site="cols = "),
        *_bounded(("_topk_kernel",), "plans.select declines k x the elements after the dim past MAX_COLS "
                  "(2**31 - 2**20): an output's offset within its slice stays below 2**31", site="out = "),
        *_bounded(("_topk_kernel",), "plans.select declines more than MAX_CHUNKS (65535) chunks and k past "
                  "K_MAX (1024): a row's keys, n_chunks * k, stay below 2**26, far from MAX_COLS (2**31 - 2**20)",
                  site="tl.store(KEYS_OUT"),
        *_bounded(("_gate_up_kernel", "_grouped_kernel", "_expert_outer_kernel"),
                  "ops.moe declines routed rows x their width (hidden or 2 x intermediate) and one expert's "
                  "weights past MAX_INDEX (2**31 - 2**20; tests/test_bench_moe.py): sorted rows, their columns, "
                  "a tile's depth and offsets within one expert's weights stay below 2**31; experts and sorted "
                  "rows are widened to int64 before their products with strides"),
        *_bounded(("_outer_kernel",), "ops.bmm declines a flat grid of more than MAX_INDEX (2**31 - 2**20) "
                  "programs, batch x m past MAX_INDEX and n past it: program ids, a batch's tiles and the tile "
                  "rows and columns stay below 2**31"),
    )


EXCEPTIONS: tuple[Excuse, ...] = (
    Excuse(
        "traffic", "_softmax", label="softmax fwd 2048x128256",
        reason="rows over SOFTMAX_SINGLE_MAX (32768) columns are split into 16384-column slices so that a "
               "few thousand rows fill every SM: one pass finds each slice's max and sum, a second reads x "
               "again to write y (a 128256-column row is 250 KB in bf16, more than a program can hold)",
        cost="1.50x: x read twice (1.58 GB moved against 1.05 GB)",
    ),
    Excuse(
        "traffic", "native_group_norm",
        reason="a group (C/32 channels x H x W: 512 KB at 8x512x64x64 in bf16) is too large for one program, so "
               "a statistics pass reads x and a normalize pass reads it again",
        cost="1.50-1.51x: x read twice",
    ),
    Excuse(
        "traffic", "native_group_norm_backward",
        reason="as the forward: a pass reads x and dy for each group's two sums, the dx pass reads both again",
        cost="1.67-1.69x: x and dy read twice",
    ),
    Excuse(
        "traffic", "native_layer_norm_backward", label="layer_norm fwd+bwd 4096x",
        reason="the weight and bias gradients are summed per persistent program (264 fp32 rows of 2N) and "
               "folded by a second kernel: 8-16 MB each way, a large share of a 4096-row call only (more rows "
               "fall under 1.10x); the partial rows stay in an H100's 50 MB L2, so DRAM sees less than counted",
        cost="1.17x in bf16 and fp16 (fp32: 1.08x)",
    ),
    Excuse(
        "traffic", "scatter_add",
        reason="every source row is added into an fp32 accumulator with atomic adds (a read and a write per "
               "element, counted here as DRAM traffic though the accumulator, 32 MB at 2048x4096, is L2-resident "
               "on an H100), then cast into the output: atomics on 16-bit values would serialize pairs",
        cost="2.67x in fp32, 4.44-4.45x in bf16 and fp16",
    ),
    Excuse(
        "traffic", "index_add",
        reason="as scatter_add: atomic adds into an fp32 accumulator, then a cast into the output",
        cost="2.67x in fp32, 4.44x in bf16 and fp16",
    ),
    Excuse(
        "traffic", "topk", label="topk fwd 1x128256",
        reason="one vocabulary row is cut into 2048-column chunks so that it runs on 63 SMs instead of one; each "
               "chunk writes its best K as int64 keys, merged by later passes",
        cost="1.20x at k=50, 2.12x at k=256 (keys of 64 and 256 per chunk against a 250 KB row)",
    ),
    Excuse(
        "traffic", "rms_norm_backward", label="rms_norm_llama fwd+bwd 4096x16384",
        reason="rows wider than NORM_BWD_REGISTER_MAX (8192) are streamed: a row-sums pass reads x and dy (and "
               "recomputes rstd, which python_native::rms_norm does not keep), the column strips read both again; "
               "the strip grid (64 strips x 4 row groups at 16384 columns) leaves SMs a quarter full, to be timed "
               "on a GPU against the reference before a wider register path is worth writing",
        cost="1.67x: x and dy read twice (674 MB moved against 403 MB)",
    ),
    Excuse(
        "warps", "_norm_bwd_cols_kernel", label="rms_norm_llama fwd+bwd 4096x16384",
        reason="the Llama casting rule rounds the normalized rows to the input's dtype for the weight gradient: "
               "72 registers a thread at 4 warps (86 in fp32); with 256 programs on 132 SMs the grid, not the "
               "registers, bounds the warps an SM holds",
        cost="28 resident warps per SM in bf16 and fp16, 20 in fp32",
    ),
    Excuse(
        "warps", "_norm_fwd_kernel", label="rms_norm_llama fwd", dtype="float32",
        reason="a 16384-column fp32 row held whole by one program of 16 warps (the row kernels' cap) is 32 values "
               "a thread: 74 registers; aten's _fused_rms_norm and native_layer_norm take the same tile at that "
               "width. 32 warps would halve it, to be timed on a GPU first",
        cost="16 resident warps per SM (74 registers per thread)",
    ),
    Excuse(
        "warps", "_norm_bwd_row_sums_kernel", label="rms_norm_llama fwd+bwd 4096x16384", dtype="float32",
        reason="the streamed backward's row-sums pass, recomputing rstd as it sums (a third accumulator), on "
               "4096-element fp32 chunks: 72 registers a thread at 4 warps",
        cost="28 resident warps per SM (72 registers per thread)",
    ),
    Excuse(
        "unmeasured", "_topk_kernel",
        reason="the merge passes read x at the columns the first pass's keys name; with launches recorded, not "
               "run, those keys are not real and the count strays outside x (the first pass is counted)",
        cost="merge passes not counted: at most K int64 keys per chunk plus K values and indices per row",
    ),
    Excuse(
        "warps", "_topk_kernel",
        reason="the sorting network (k > 8) holds a whole chunk of int64 keys, two registers each, plus the "
               "pairs it exchanges: 112-122 registers at 4-8 warps. More warps per chunk would spread the keys "
               "thinner; that trade is to be timed on a GPU, topk being unmeasured there so far",
        cost="16-20 resident warps per SM (112-122 registers per thread)",
    ),
    Excuse(
        "traffic", "moe_experts",
        reason="grouped GEMMs on 32x32 tiles: each sorted row is read once per 32 output columns and each "
               "expert's weights once per 32 of its rows (tile reuse an H100's L2 serves); the op is GEMM-bound, "
               "its figure of merit the bench rows' time, not bytes against the minimum",
        cost="26-27x the minimum in loads counted at the bench shapes",
    ),
    Excuse(
        "traffic", "moe_experts_backward",
        reason="as the forward, and the weight gradients' per-expert GEMMs read both operands once per 32 "
               "columns of the other; the count of those (``_expert_outer_kernel``) is also scaled from the "
               "first and last expert's programs while the stand-in indices route every token to the first, "
               "so it stands at E/2 times what uniform routing reads",
        cost="203x the minimum at 2048x1024x512x16x4, 1537x at 8192x2048x768x128x8, in loads counted",
    ),
    Excuse(
        "warps", "_gate_up_kernel", label="moe_experts",
        reason="two fp32 accumulators (gate and up, 32x32 each) and their operand tiles: 210 registers a thread "
               "at 4 warps; a GEMM hides load latency in its MMA pipeline more than with resident warps, and its "
               "tiles and stages are to be tuned against time on a GPU (bench's moe_experts rows)",
        cost="8 resident warps per SM (210 registers per thread)",
    ),
) + int32_bounds()
