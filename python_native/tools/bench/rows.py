"""What the benchmark measures: its rows, read from the op declarations (``Op.bench_rows``), and each
row's cases (op, mode, shape, dtype), inputs, torch call and bytes moved.

Every row is declared with the op it reaches (``python_native_dsls.proving.BenchRow``): the aten
ops' rows beside their families (``python_native_dsls.bench_cases`` for those both backends
override), the custom ops' rows (``torch.ops.python_native.*``, what model patching routes to)
beside theirs. A custom op's row calls the op: with the overrides on, the kernels; with the DSL
disabled (the "aten" column), the op's reference, the plain-torch formula of the module it
replaces, which Inductor compiles (``formula``). The MoE rows are GEMM-bound, so their figure of
merit is time (their row's ``flops`` gives the FLOPs a rate is taken from).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from python_native_dsls.catalogue import built_ops
from python_native_dsls.proving import BenchRow


def _declared() -> dict[str, BenchRow]:
    """The rows the declarations carry, by name, in declaration order (the first op to declare a name wins)."""
    found: dict[str, BenchRow] = {}
    for built in built_ops():
        for row in built.op.bench_rows:
            found.setdefault(row.name, row)
    return found


DECLARED = _declared()
OPS = tuple(DECLARED)


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


def cases(dtypes: Sequence[torch.dtype], quick: bool, ops: Sequence[str] | None = None) -> list[Case]:
    """The rows to measure, each once: in a full run, the rows at LLM shapes first (``BenchRow.llm``)
    whose dtype is among ``dtypes``; then per dtype each row's quick or full shapes in its modes."""
    wanted = set(ops or OPS)
    rows = [row for name, row in DECLARED.items() if name in wanted]
    found: dict[Case, None] = {}
    if not quick:
        found.update((Case(row.name, c.mode, c.shape, c.dtype), None) for row in rows for c in row.llm
                     if c.dtype in dtypes)
    for dtype in dtypes:
        found.update((Case(row.name, mode, shape, dtype), None) for row in rows
                     for shape in (row.quick if quick else row.full) for mode in row.modes)
    return list(found)


def _named(name: str, default: Any = None) -> property:
    """A field of ``Inputs``: the row's value of that name, ``default`` where the row has none."""
    return property(lambda self: self.named.get(name, default))


@dataclass
class Inputs:
    """Tensors of one case by name, as its row makes them (``BenchRow.inputs``): ``dy`` for the
    backward, ``leaves`` the tensors whose gradients are reset between runs, and the names the
    aten rows use (``x``, weight ``w``, bias ``b``, second operand ``c``, ``index``, topk's ``k``)."""

    named: dict = field(default_factory=dict)
    w = _named("w")
    b = _named("b")
    c = _named("c")
    index = _named("index")
    k = _named("k", 0)
    dy = _named("dy")
    leaves = _named("leaves", [])

    @property
    def x(self) -> torch.Tensor:
        """The row's input ``x``, or its first tensor (a custom op's row names its own)."""
        found = self.named.get("x")
        return found if found is not None else next(v for v in self.named.values() if isinstance(v, torch.Tensor))


def backward(out: torch.Tensor | tuple[torch.Tensor, ...], dy: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
    """Backpropagate ``dy`` from ``out`` (a tuple of outputs takes a tuple of gradients)."""
    if isinstance(out, tuple):
        torch.autograd.backward(out, dy)
    else:
        out.backward(dy)


def make_inputs(case: Case, device: str) -> Inputs:
    """The tensors of ``case`` on ``device`` (asking for gradients in a ``fwd+bwd`` row)."""
    return Inputs(DECLARED[case.op].inputs(case.shape, case.dtype, device, case.mode == "fwd+bwd"))


def _reached() -> list[tuple[str, str]]:
    """``(row, op symbol)`` for every benchmark row an op of a built-in family names (``Op.bench``),
    in family order."""
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


def torch_function(op: str) -> Callable[[Inputs], torch.Tensor]:
    """The public torch call of row ``op`` (what users write, and what Inductor compiles where the
    row declares no ``formula``)."""
    call = DECLARED[op].call
    return lambda i: call(i.named)


def formula(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    """The plain-torch formula a custom op's row replaces (what Inductor compiles), or None."""
    found = DECLARED[op].formula
    return None if found is None else (lambda i: found(i.named))


def bytes_moved(case: Case) -> int:
    """What the row must move at least (``BenchRow.bytes``): inputs read once, outputs written once."""
    return DECLARED[case.op].bytes(case.shape, case.mode, torch.empty((), dtype=case.dtype).element_size())

