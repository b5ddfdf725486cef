"""What the benchmark measures: its ops, rows and shapes, each row's inputs, torch call and bytes moved."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from python_native.tools.bench import model_rows

# Reductions over one dim (the last, or the first for ``sum_dim0``): forward only, their backward
# formulas are aten's (expand, scatter, a masked division).
REDUCTIONS = ("sum", "sum_dim0", "mean", "prod", "amax", "amin", "argmax", "argmin", "max_dim", "min_dim")
# Ops whose shape is not just the input's: topk's is (rows, cols, k); scatter_add's and index_add's
# (tokens, hidden, rows): tokens x hidden source rows added into rows x hidden along dim 0, by one
# row index per token (scatter_add's index is that column expanded along hidden, as MoE code does).
INDEXING = ("topk", "scatter_add", "index_add")
OPS = ("rms_norm", "layer_norm", "softmax", "log_softmax", "silu", "gelu", "gelu_tanh", "bmm_outer",
       "group_norm", "group_norm_cl", "dropout", *REDUCTIONS, *INDEXING, *model_rows.OPS)

# Group norm rows normalize 32 groups (the diffusion U-Net's), or as many as divide C; ``group_norm_cl``
# is the same on a channels-last input. Dropout rows drop with p = 0.1 in training mode.
GROUPS = 32
DROPOUT_P = 0.1

# Bytes moved per element of the input, in units of its element size: forward reads x and writes y
# (2); backward reads x (or y) and dy and writes dx (3). Weights and per-row statistics are ignored.
IO_FACTOR = {"fwd": 2.0, "fwd+bwd": 5.0}


@dataclass(frozen=True)
class Case:
    """One benchmark row before it is measured."""

    op: str
    mode: str  # "fwd" | "fwd+bwd"
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return f"{self.op} {self.mode} {'x'.join(map(str, self.shape))}"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


@dataclass
class Row:
    """One measured row (``--json`` prints these)."""

    op: str
    mode: str
    shape: list[int]
    dtype: str
    fired: bool
    override_ms: float
    aten_ms: float
    speedup: float
    bytes: int
    bandwidth_fraction: float | None
    inductor_ms: float | None = None
    liger_ms: float | None = None
    quack_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    variants_ms: dict[str, float] = field(default_factory=dict)  # --variants: each other variant's time


# Shapes the norms/softmaxes of LLM training and inference hit, plus the historical grid.
_FULL_ROWS = [(4096, 4096), (8192, 4096), (16384, 5120), (4096, 8192), (32768, 1024)]
_EXTRA: list[tuple[str, str, tuple[int, ...], str | None]] = [
    ("rms_norm", "fwd+bwd", (16384, 4096), None),
    ("rms_norm", "fwd+bwd", (8192, 8192), None),
    ("rms_norm", "fwd+bwd", (32768, 2048), None),
    ("layer_norm", "fwd+bwd", (16384, 4096), None),
    ("layer_norm", "fwd+bwd", (32768, 1024), None),
    ("softmax", "fwd", (4096, 32000), None),
    ("softmax", "fwd+bwd", (4096, 32000), None),
    ("softmax", "fwd", (2048, 128256), None),
    ("softmax", "fwd+bwd", (16384, 4096), None),
    ("log_softmax", "fwd+bwd", (4096, 32000), "float32"),
    # Sampling from a Llama-3 vocabulary (one sequence, a batch of 64) and MoE routing.
    ("topk", "fwd", (1, 128256, 50), None),
    ("topk", "fwd", (1, 128256, 256), None),
    ("topk", "fwd", (64, 128256, 50), None),
    ("topk", "fwd", (4096, 4096, 8), None),
    ("topk", "fwd", (1, 128256, 50), "float32"),
    ("topk", "fwd", (4096, 4096, 8), "float32"),
    # MoE combine: 16384 token slots of hidden 4096 into 2048 token rows.
    ("scatter_add", "fwd", (16384, 4096, 2048), None),
    ("scatter_add", "fwd", (16384, 4096, 2048), "float32"),
    ("index_add", "fwd", (16384, 4096, 2048), None),
    ("index_add", "fwd", (16384, 4096, 2048), "float32"),
    *[(op, mode, (8, 512, 64, 64), dtype) for op in ("group_norm", "group_norm_cl") for mode in ("fwd", "fwd+bwd")
      for dtype in (None, "float32")],
    *[("dropout", mode, (8192, 4096), dtype) for mode in ("fwd", "fwd+bwd") for dtype in (None, "float32")],
]
# Ops with shapes of their own (4-D activations, or any size), besides the named rows above.
_OWN_SHAPES: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {  # op -> (quick, full)
    "group_norm": ([(2, 8, 4, 4)], [(16, 256, 32, 32), (4, 1280, 16, 16), (2, 320, 128, 128)]),
    "group_norm_cl": ([(2, 8, 4, 4)], [(16, 256, 32, 32), (4, 1280, 16, 16), (2, 320, 128, 128)]),
    "dropout": ([(4, 64)], [(4096, 4096), (16384, 5120)]),
    **model_rows.SHAPES,
}
_GRID = [
    ("layer_norm", "fwd"), ("layer_norm", "fwd+bwd"), ("rms_norm", "fwd"), ("rms_norm", "fwd+bwd"),
    ("softmax", "fwd"), ("softmax", "fwd+bwd"), ("log_softmax", "fwd"), ("silu", "fwd"), ("silu", "fwd+bwd"),
    ("gelu", "fwd"), ("gelu_tanh", "fwd"),
]


# Reductions at LLM shapes: hidden states, MLP rows, many narrow rows, and one vocabulary row (sampling).
_REDUCE_ROWS = [(4096, 4096), (8192, 4096), (32768, 1024), (1, 128256)]
_REDUCE_DTYPES = (torch.bfloat16, torch.float32)


def cases(dtypes: Sequence[torch.dtype], quick: bool, ops: Sequence[str] | None = None) -> list[Case]:
    """The rows to measure: the named LLM shapes first (bf16 unless stated) whose dtype is among
    ``dtypes``, the reductions at their shapes in bf16 and fp32, then the grid per dtype."""
    wanted = set(ops or OPS)
    out: list[Case] = []
    if not quick:
        for op, mode, shape, dtype_name in _EXTRA:
            dtype = getattr(torch, dtype_name or "bfloat16")
            if op in wanted and dtype in dtypes:
                out.append(Case(op, mode, shape, dtype))
        for op in (op for op in REDUCTIONS if op in wanted):
            out += [Case(op, "fwd", shape, dtype) for dtype in _REDUCE_DTYPES if dtype in dtypes for shape in _REDUCE_ROWS]
    if quick:
        for dtype in dtypes:
            out += [Case(op, "fwd", shape, dtype) for op in REDUCTIONS if op in wanted for shape in [(4, 64), (7, 100)]]
    for dtype in dtypes:
        for m, n in [(4, 64), (7, 100)] if quick else _FULL_ROWS:
            out += [c for op, mode in _GRID if op in wanted and (c := Case(op, mode, (m, n), dtype)) not in out]
        for shape in [(2, 8, 16)] if quick else [(64, 1024, 1024), (256, 512, 512), (16, 4096, 4096)]:
            if "bmm_outer" in wanted:
                out.append(Case("bmm_outer", "fwd", shape, dtype))
        for op, shapes in _INDEXING_GRID.items():
            for shape in shapes[quick]:
                if op in wanted and (c := Case(op, "fwd", shape, dtype)) not in out:
                    out.append(c)
        for op, (small, full) in _OWN_SHAPES.items():
            if op in wanted:
                out += [Case(op, mode, shape, dtype) for shape in (small if quick else full) for mode in ("fwd", "fwd+bwd")]
    return out


# Per op: (full shapes, quick shapes), in the encoding of ``INDEXING``.
_INDEXING_GRID = {
    "topk": ([(4096, 4096, 8), (8192, 4096, 8), (4096, 32000, 50), (64, 128256, 256)], [(4, 64, 4), (7, 100, 20)]),
    "scatter_add": ([(16384, 4096, 2048), (32768, 2048, 4096), (8192, 7168, 1024)], [(64, 32, 16)]),
    "index_add": ([(16384, 4096, 2048), (32768, 2048, 4096), (8192, 7168, 1024)], [(64, 32, 16)]),
}


@dataclass
class Inputs:
    """Tensors of one case: ``x`` (and weight/bias), ``dy`` for the backward, tensors to reset grads of."""

    x: torch.Tensor
    w: torch.Tensor | None = None
    b: torch.Tensor | None = None
    c: torch.Tensor | None = None  # second bmm operand
    dy: torch.Tensor | None = None
    leaves: list[torch.Tensor] = dataclasses.field(default_factory=list)
    index: torch.Tensor | None = None  # scatter_add / index_add
    k: int = 0  # topk
    named: dict = dataclasses.field(default_factory=dict)  # the custom ops' rows (``model_rows``), by name


def backward(out: torch.Tensor | tuple[torch.Tensor, ...], dy: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
    """Backpropagate ``dy`` from ``out`` (a tuple of outputs takes a tuple of gradients)."""
    if isinstance(out, tuple):
        torch.autograd.backward(out, dy)
    else:
        out.backward(dy)


def make_inputs(case: Case, device: str) -> Inputs:
    grad = case.mode == "fwd+bwd"
    if case.op in model_rows.SHAPES:
        named = model_rows.make_inputs(case.op, case.shape, case.dtype, device, grad)
        first = next(v for v in named.values() if isinstance(v, torch.Tensor))
        return Inputs(first, dy=named["dy"], leaves=named["leaves"], named=named)
    if case.op == "topk":
        rows, cols, k = case.shape
        return Inputs(torch.randn(rows, cols, device=device, dtype=case.dtype), k=k)
    if case.op in ("scatter_add", "index_add"):
        tokens, hidden, rows = case.shape
        index = torch.randint(0, rows, (tokens,), device=device)
        return Inputs(torch.zeros(rows, hidden, device=device, dtype=case.dtype),
                      c=torch.randn(tokens, hidden, device=device, dtype=case.dtype),
                      index=index[:, None].expand(tokens, hidden) if case.op == "scatter_add" else index)
    if case.op == "bmm_outer":
        bsz, m, n = case.shape
        return Inputs(torch.randn(bsz, m, 1, device=device, dtype=case.dtype),
                      c=torch.randn(bsz, 1, n, device=device, dtype=case.dtype))
    n = case.shape[1] if case.op.startswith("group_norm") else case.shape[-1]
    x = torch.randn(*case.shape, device=device, dtype=case.dtype)
    if case.op == "group_norm_cl":
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(grad)
    inputs = Inputs(x, leaves=[x] if grad else [])
    if case.op in ("rms_norm", "layer_norm", "group_norm", "group_norm_cl"):
        inputs.w = torch.randn(n, device=device, dtype=case.dtype, requires_grad=grad)
        inputs.leaves += [inputs.w] if grad else []
    if case.op in ("layer_norm", "group_norm", "group_norm_cl"):
        inputs.b = torch.randn(n, device=device, dtype=case.dtype, requires_grad=grad)
        inputs.leaves += [inputs.b] if grad else []
    if grad:
        inputs.dy = torch.randn_like(x, requires_grad=False)  # in x's layout, as autograd would hand it
    return inputs


def _reached() -> list[tuple[str, str]]:
    """``(row, op symbol)`` for every benchmark row an op of a built-in family names (``Op.bench``),
    in family order."""
    from python_native_dsls.catalogue import built_ops

    return [(row, b.spec.op) for b in built_ops() for row in b.op.bench]


def symbols_of(ops: Sequence[str]) -> list[str]:
    """The op symbols the rows of ``ops`` reach (``softmax`` -> ``_softmax``, ``_softmax_backward_data``),
    as the op families of every built-in backend name them (``Op.bench``), each once, in family order."""
    wanted = set(ops)
    return list(dict.fromkeys(symbol for row, symbol in _reached() if row in wanted))


def row_symbols() -> dict[str, tuple[str, ...]]:
    """Per benchmark row, the op symbols it reaches (``symbols_of`` of that row alone)."""
    found: dict[str, dict[str, None]] = {}
    for row, symbol in _reached():
        found.setdefault(row, {})[symbol] = None
    return {row: tuple(symbols) for row, symbols in found.items()}


def groups_of(channels: int) -> int:
    """The group count of a group norm row: ``GROUPS``, or the largest count dividing it that divides C."""
    return math.gcd(channels, GROUPS)


def torch_function(op: str) -> Callable[[Inputs], torch.Tensor]:
    """The public torch call of ``op`` (what users write, and what Inductor compiles)."""
    table: dict[str, Callable[[Inputs], torch.Tensor]] = {
        "rms_norm": lambda i: F.rms_norm(i.x, (i.x.shape[-1],), i.w, 1e-6),
        "layer_norm": lambda i: F.layer_norm(i.x, (i.x.shape[-1],), i.w, i.b),
        "softmax": lambda i: torch.softmax(i.x, -1),
        "log_softmax": lambda i: torch.log_softmax(i.x, -1),
        "silu": lambda i: F.silu(i.x),
        "gelu": lambda i: F.gelu(i.x),
        "gelu_tanh": lambda i: F.gelu(i.x, approximate="tanh"),
        "bmm_outer": lambda i: torch.bmm(i.x, i.c),
        "sum": lambda i: i.x.sum(-1),
        "sum_dim0": lambda i: i.x.sum(0),
        "mean": lambda i: i.x.mean(-1),
        "prod": lambda i: i.x.prod(-1),
        "amax": lambda i: i.x.amax(-1),
        "amin": lambda i: i.x.amin(-1),
        "argmax": lambda i: i.x.argmax(-1),
        "argmin": lambda i: i.x.argmin(-1),
        "max_dim": lambda i: torch.max(i.x, -1).values,
        "min_dim": lambda i: torch.min(i.x, -1).values,
        "topk": lambda i: torch.topk(i.x, i.k).values,
        "scatter_add": lambda i: i.x.scatter_add(0, i.index, i.c),
        "index_add": lambda i: i.x.index_add(0, i.index, i.c),
        "group_norm": lambda i: F.group_norm(i.x, groups_of(i.x.shape[1]), i.w, i.b),
        "group_norm_cl": lambda i: F.group_norm(i.x, groups_of(i.x.shape[1]), i.w, i.b),
        "dropout": lambda i: F.dropout(i.x, DROPOUT_P, training=True),
    }
    if op in model_rows.FUNCTIONS:
        return lambda i: model_rows.FUNCTIONS[op](i.named)
    return table[op]


def formula(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    """The plain-torch formula a custom op's row replaces (what Inductor compiles), or None."""
    found = model_rows.FORMULAS.get(op)
    return None if found is None else (lambda i: found(i.named))


def _reduction_bytes(case: Case, itemsize: int) -> int:
    """The input read once, and each kept position's value (input dtype) and/or index (int64) written."""
    kept = case.shape[-1] if case.op == "sum_dim0" else math.prod(case.shape[:-1])
    per_kept = {"argmax": 8, "argmin": 8, "max_dim": itemsize + 8, "min_dim": itemsize + 8}.get(case.op, itemsize)
    return math.prod(case.shape) * itemsize + kept * per_kept


def bytes_moved(case: Case) -> int:
    itemsize = torch.empty((), dtype=case.dtype).element_size()
    if case.op in model_rows.SHAPES:
        return model_rows.bytes_moved(case.op, case.shape, case.mode, itemsize)
    if case.op in REDUCTIONS:
        return _reduction_bytes(case, itemsize)
    if case.op == "bmm_outer":
        bsz, m, n = case.shape
        return (bsz * m * n + bsz * (m + n)) * itemsize
    if case.op == "topk":  # read x, write k values and int64 indices per row
        rows, cols, k = case.shape
        return rows * (cols * itemsize + k * (itemsize + 8))
    if case.op in ("scatter_add", "index_add"):  # read source and one index per token, copy self
        tokens, hidden, rows = case.shape
        return tokens * (hidden * itemsize + 8) + 2 * rows * hidden * itemsize
    if case.op == "dropout":  # plus a one-byte mask written (and read back by the backward)
        return int(math.prod(case.shape) * (IO_FACTOR[case.mode] * itemsize + (1 if case.mode == "fwd" else 2)))
    return int(IO_FACTOR[case.mode] * math.prod(case.shape) * itemsize)
