"""Benchmark of the overrides against aten (and other libraries when installed), per op, dtype, shape.

Every row runs the same torch call in one process: with the overrides on, then under
``pn.triton.disabled()`` (aten), plus ``torch.compile`` of the same function (Inductor) and the
Liger-Kernel / QuACK equivalents where those packages are installed ("–" otherwise). On a GPU the
timer is ``triton.testing.do_bench`` (median of many runs after warm-up; input gradients reset to
None between runs of fwd+bwd rows). ``bandwidth`` is the fraction of the device's measured copy
bandwidth the override reaches, from the bytes the op must move (its shapes and dtypes).
``fired`` says whether an override ran (``pn.trace()``); only those rows enter the geometric mean.

Without a GPU, ``quick`` runs tiny shapes through Triton's interpreter: that proves the path end to
end, its timings say nothing about speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import python_native as pn

Fn = Callable[[], object]
MISSING = "–"

OPS = ("rms_norm", "layer_norm", "softmax", "log_softmax", "silu", "gelu", "gelu_tanh", "bmm_outer")

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
]
_GRID = [
    ("layer_norm", "fwd"), ("layer_norm", "fwd+bwd"), ("rms_norm", "fwd"), ("rms_norm", "fwd+bwd"),
    ("softmax", "fwd"), ("softmax", "fwd+bwd"), ("log_softmax", "fwd"), ("silu", "fwd"), ("silu", "fwd+bwd"),
    ("gelu", "fwd"), ("gelu_tanh", "fwd"),
]


def cases(dtypes: Sequence[torch.dtype], quick: bool, ops: Sequence[str] | None = None) -> list[Case]:
    """The rows to measure: the named LLM shapes first (bf16 unless stated) whose dtype is among
    ``dtypes``, then the grid per dtype."""
    wanted = set(ops or OPS)
    out: list[Case] = []
    if not quick:
        for op, mode, shape, dtype_name in _EXTRA:
            dtype = getattr(torch, dtype_name or "bfloat16")
            if op in wanted and dtype in dtypes:
                out.append(Case(op, mode, shape, dtype))
    for dtype in dtypes:
        for m, n in [(4, 64), (7, 100)] if quick else _FULL_ROWS:
            out += [c for op, mode in _GRID if op in wanted and (c := Case(op, mode, (m, n), dtype)) not in out]
        for shape in [(2, 8, 16)] if quick else [(64, 1024, 1024), (256, 512, 512), (16, 4096, 4096)]:
            if "bmm_outer" in wanted:
                out.append(Case("bmm_outer", "fwd", shape, dtype))
    return out


@dataclass
class Inputs:
    """Tensors of one case: ``x`` (and weight/bias), ``dy`` for the backward, tensors to reset grads of."""

    x: torch.Tensor
    w: torch.Tensor | None = None
    b: torch.Tensor | None = None
    c: torch.Tensor | None = None  # second bmm operand
    dy: torch.Tensor | None = None
    leaves: list[torch.Tensor] = dataclasses.field(default_factory=list)


def make_inputs(case: Case, device: str) -> Inputs:
    grad = case.mode == "fwd+bwd"
    if case.op == "bmm_outer":
        bsz, m, n = case.shape
        return Inputs(torch.randn(bsz, m, 1, device=device, dtype=case.dtype),
                      c=torch.randn(bsz, 1, n, device=device, dtype=case.dtype))
    n = case.shape[-1]
    x = torch.randn(*case.shape, device=device, dtype=case.dtype, requires_grad=grad)
    inputs = Inputs(x, leaves=[x] if grad else [])
    if case.op in ("rms_norm", "layer_norm"):
        inputs.w = torch.randn(n, device=device, dtype=case.dtype, requires_grad=grad)
        inputs.leaves += [inputs.w] if grad else []
    if case.op == "layer_norm":
        inputs.b = torch.randn(n, device=device, dtype=case.dtype, requires_grad=grad)
        inputs.leaves += [inputs.b] if grad else []
    if grad:
        inputs.dy = torch.randn(*case.shape, device=device, dtype=case.dtype)
    return inputs


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
    }
    return table[op]


def _liger(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    try:
        if op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            # offset 0, Llama casting, not in place (in place would overwrite dy between runs).
            return lambda i: LigerRMSNormFunction.apply(i.x, i.w, 1e-6, 0.0, "llama", False)
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return lambda i: LigerLayerNormFunction.apply(i.x, i.w, i.b, 1e-5)
        if op == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            return lambda i: LigerSoftmaxFunction.apply(i.x)
    except ImportError:
        return None
    return None


def _quack(op: str) -> Callable[[Inputs], torch.Tensor] | None:
    try:
        if op == "rms_norm":
            from quack.rmsnorm import rmsnorm

            return lambda i: rmsnorm(i.x, i.w, eps=1e-6)
        if op == "softmax":
            from quack.softmax import softmax

            return lambda i: softmax(i.x)
    except ImportError:
        return None
    return None


def competitors(op: str, inductor: bool) -> dict[str, Callable[[Inputs], torch.Tensor] | None]:
    """Other implementations of the same function: None where absent (printed as "–")."""
    compiled = None
    if inductor:
        # Each row compiles its own graph: past Dynamo's recompile limit a shared function would
        # silently run eagerly, and its column would report aten's time as Inductor's.
        torch._dynamo.reset()
        compiled = torch.compile(torch_function(op), dynamic=False)
    return {"inductor_ms": compiled, "liger_ms": _liger(op), "quack_ms": _quack(op)}


def runner(case: Case, fn: Callable[[Inputs], torch.Tensor], inputs: Inputs) -> Fn:
    if case.mode == "fwd":
        return lambda: fn(inputs)
    return lambda: fn(inputs).backward(inputs.dy)


Timer = Callable[[Fn, list[torch.Tensor]], float]


def gpu_timer() -> Timer:
    import triton.testing

    def measure(fn: Fn, leaves: list[torch.Tensor]) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=leaves or None, return_mode="median")

    return measure


def gpu_throughput_timer(loops: int = 5, budget_ms: float = 20.0) -> Timer:
    """Milliseconds per call of back-to-back calls (CUDA events around a loop; median of ``loops``).

    Unlike ``do_bench``, which times each call alone after flushing the cache, this charges a call
    whatever it costs the stream in steady state, host time included: for small inputs the host is
    the bottleneck, and that is what a user's eager loop pays. Calibration uses it, so that an
    override whose kernel is quick but whose launch is not still loses where it should.
    """

    def measure(fn: Fn, leaves: list[torch.Tensor]) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        n = max(1, min(10_000, int(budget_ms / max(start.elapsed_time(end), 1e-3))))
        samples = []
        for _ in range(loops):
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / n)
        return statistics.median(samples)

    return measure


def cpu_timer(repeats: int = 3) -> Timer:
    def measure(fn: Fn, leaves: list[torch.Tensor]) -> float:
        samples = []
        for _ in range(repeats + 1):
            for leaf in leaves:
                leaf.grad = None
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples[1:])  # the first run compiles/warms up

    return measure


def copy_bandwidth(device: str, timer: Timer, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy of a large tensor (read + write counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), [])
    return 2 * nbytes / (ms * 1e-3)


def bytes_moved(case: Case) -> int:
    itemsize = torch.empty((), dtype=case.dtype).element_size()
    if case.op == "bmm_outer":
        bsz, m, n = case.shape
        return (bsz * m * n + bsz * (m + n)) * itemsize
    return int(IO_FACTOR[case.mode] * math.prod(case.shape) * itemsize)


def _fired(fn: Fn) -> bool:
    with pn.trace() as t:
        fn()
    return any(e.dsl == "triton" and e.outcome == "override" for e in t.events)


def measure_case(case: Case, device: str, timer: Timer, bandwidth: float | None, inductor: bool) -> Row:
    inputs = make_inputs(case, device)
    fn = runner(case, torch_function(case.op), inputs)
    fired = _fired(fn)
    ours = timer(fn, inputs.leaves)
    with pn.triton.disabled():
        base = timer(fn, inputs.leaves)
    if ours and (base / ours < 0.97 or (not fired and base / ours > 1.03)):
        # Suspicious: slower where an override fired, or different where nothing did (then both
        # ran aten). Time both again and keep each side's best, so a GPU clock or host hiccup
        # during one measurement does not make the row.
        ours = min(ours, timer(fn, inputs.leaves))
        with pn.triton.disabled():
            base = min(base, timer(fn, inputs.leaves))
    nbytes = bytes_moved(case)
    row = Row(
        op=case.op, mode=case.mode, shape=list(case.shape), dtype=case.dtype_name, fired=fired,
        override_ms=ours, aten_ms=base, speedup=base / ours if ours else float("nan"), bytes=nbytes,
        bandwidth_fraction=nbytes / (ours * 1e-3) / bandwidth if bandwidth and ours else None,
    )
    for column, other in competitors(case.op, inductor).items():
        if other is None:
            continue
        try:
            # Inductor compiles the plain torch function: with the overrides off, so it is pure Inductor.
            with pn.triton.disabled():
                setattr(row, column, timer(runner(case, other, inputs), inputs.leaves))
        except Exception as e:  # a competitor that rejects this shape/dtype costs its cell, not the run
            row.notes.append(f"{column.removesuffix('_ms')}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
    return row


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "triton": str(pn.triton.version), "device": device}
    if device == "cuda":
        from python_native import calibration

        info["device_name"] = calibration.device_key(torch.device("cuda", torch.cuda.current_device()))
    else:
        info["device_name"] = "cpu (Triton interpreter)"
    return info


def run_rows(cases_: Sequence[Case], device: str, inductor: bool, progress: Callable[[Row], None] | None = None,
             bandwidth: float | None = None) -> list[Row]:
    timer = gpu_timer() if device == "cuda" else cpu_timer()
    rows = []
    for case in cases_:
        row = measure_case(case, device, timer, bandwidth, inductor)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def _cell(value: float | None, fmt: str = "10.4f") -> str:
    return f"{value:{fmt}}" if value is not None else f"{MISSING:>{fmt.split('.')[0]}}"


HEADER = (f"{'case':<34} {'dtype':<9} {'fired':<6} {'pn ms':>10} {'aten ms':>10} {'speedup':>8} "
          f"{'inductor':>10} {'liger':>10} {'quack':>10} {'%bw':>5}")


def format_row(row: Row) -> str:
    label = f"{row.op} {row.mode} {'x'.join(map(str, row.shape))}"
    bw = f"{100 * row.bandwidth_fraction:5.0f}" if row.bandwidth_fraction is not None else f"{MISSING:>5}"
    line = (f"{label:<34} {row.dtype:<9} {'yes' if row.fired else 'no':<6} {row.override_ms:10.4f} "
            f"{row.aten_ms:10.4f} {row.speedup:7.2f}x {_cell(row.inductor_ms)} {_cell(row.liger_ms)} "
            f"{_cell(row.quack_ms)} {bw}")
    return line + ("  # " + "; ".join(row.notes) if row.notes else "")


def geometric_mean_line(rows: Sequence[Row]) -> str:
    fired = [r.speedup for r in rows if r.fired and r.speedup > 0]
    if not fired:
        return "no override fired"
    geo = math.exp(sum(math.log(r) for r in fired) / len(fired))
    return (f"geometric-mean speedup where an override fired: {geo:.2f}x over {len(fired)} rows; "
            f"slowest {min(fired):.2f}x")


def plot(rows: Sequence[Row], path: str) -> None:
    """One subplot per op: speedup over aten against element count (log scale), one line per (mode, dtype)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from e
    ops = sorted({r.op for r in rows})
    fig, axes = plt.subplots(len(ops), 1, figsize=(9, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops, strict=True):
        series: dict[str, list[Row]] = {}
        for r in rows:
            if r.op == op:
                series.setdefault(f"{r.mode} {r.dtype}", []).append(r)
        ticks: dict[int, str] = {}
        for name, points in sorted(series.items()):
            points.sort(key=lambda r: math.prod(r.shape))
            ax.plot([math.prod(r.shape) for r in points], [r.speedup for r in points], marker="o", label=name)
            for r in points:
                ticks.setdefault(math.prod(r.shape), "x".join(map(str, r.shape)))
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ticks), list(ticks.values()), fontsize=7, rotation=20)
        ax.minorticks_off()
        ax.set_xlabel("shape (log scale of elements)")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(op)
        ax.set_ylabel("speedup vs aten")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_dtypes(text: str) -> list[torch.dtype]:
    allowed = ("float32", "float16", "bfloat16")
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in allowed]
    if bad or not names:
        raise ValueError(f"--dtypes {text!r}: unknown dtype(s) {bad}; allowed: {', '.join(allowed)}")
    return [getattr(torch, name) for name in names]


def parse_ops(text: str | None) -> list[str] | None:
    if not text:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in OPS]
    if bad or not names:
        raise ValueError(f"--ops {text!r}: unknown op(s) {bad}; allowed: {', '.join(OPS)}")
    return names


def pick_device(quick: bool) -> str:
    """``cuda`` when the backend runs on a GPU; ``cpu`` in interpreter mode (a warning for full shapes)."""
    if not pn.triton.available:
        raise RuntimeError(f"triton DSL unavailable: {pn.triton.unavailable_reason}")
    from python_native_dsls.triton import device_type

    device = device_type()
    if device == "cpu" and not quick:
        print("warning: no GPU; full shapes through Triton's interpreter take minutes (use --quick)", file=sys.stderr)
    return device


# ---------------------------------------------------------------------------------------------
# Calibration: each overridden aten op called directly, override vs aten, per dtype and size bucket.

CalibArgs = Callable[[torch.Tensor, torch.Tensor], tuple]


def _calibration_args() -> dict[str, CalibArgs]:
    """Per overridden aten op: its arguments built from an input ``x`` (rows x cols) and a gradient ``dy``."""
    aten = torch.ops.aten

    def ln_stats(x: torch.Tensor) -> tuple:
        n = x.shape[-1]
        w, b = torch.randn(n, device=x.device, dtype=x.dtype), torch.randn(n, device=x.device, dtype=x.dtype)
        with _aten_only():
            _, mean, rstd = aten.native_layer_norm(x, [n], w, b, 1e-5)
        return w, b, mean, rstd

    def rms_stats(x: torch.Tensor) -> tuple:
        w = torch.randn(x.shape[-1], device=x.device, dtype=x.dtype)
        with _aten_only():
            _, rstd = aten._fused_rms_norm(x, [x.shape[-1]], w, 1e-6)
        return w, rstd

    def softmax_out(x: torch.Tensor, log: bool) -> torch.Tensor:
        with _aten_only():
            return (aten._log_softmax if log else aten._softmax)(x, -1, False)

    def weight(x: torch.Tensor) -> torch.Tensor:
        return torch.randn(x.shape[-1], device=x.device, dtype=x.dtype)

    return {
        "native_layer_norm": lambda x, dy: (x, [x.shape[-1]], weight(x), weight(x), 1e-5),
        "native_layer_norm_backward": lambda x, dy: (
            (lambda w, b, mean, rstd: (dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True]))(*ln_stats(x))
        ),
        "_fused_rms_norm": lambda x, dy: (x, [x.shape[-1]], weight(x), 1e-6),
        "_fused_rms_norm_backward": lambda x, dy: (
            (lambda w, rstd: (dy, x, [x.shape[-1]], rstd, w, [True, True]))(*rms_stats(x))
        ),
        "_softmax": lambda x, dy: (x, -1, False),
        "_log_softmax": lambda x, dy: (x, -1, False),
        "_softmax_backward_data": lambda x, dy: (dy, softmax_out(x, False), -1, x.dtype),
        "_log_softmax_backward_data": lambda x, dy: (dy, softmax_out(x, True), -1, x.dtype),
        "silu": lambda x, dy: (x,),
        "silu_backward": lambda x, dy: (dy, x),
        "gelu": lambda x, dy: (x,),
        "gelu_backward": lambda x, dy: (dy, x),
        # An outer product per batch entry: the first operand has as many elements as x.
        "bmm": lambda x, dy: (x.reshape(x.shape[0], x.shape[1], 1), torch.ones_like(x[:, :16]).reshape(-1, 1, 16)),
    }


def calibration_shapes(quick: bool) -> list[tuple[int, int]]:
    """Two row widths per size bucket (a narrow and a wide row), 2^13..2^27 elements (tiny when quick)."""
    if quick:
        return [(4, 64), (2, 128), (16, 64), (8, 128)]
    shapes = []
    for log2_numel in range(13, 28, 2):
        for cols in (1024, 8192):
            if (1 << log2_numel) >= cols:
                shapes.append(((1 << log2_numel) // cols, cols))
    return shapes


def _aten_only() -> Any:
    """A scope with every DSL switched off: the calls go to aten."""
    from python_native import controller, dsl_registry

    return controller.Scope("dsl", tuple(dsl_registry.names()))


def calibrated_dsls(ops: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Per aten op symbol with a calibration builder: the installed, available DSLs overriding it (in slot order)."""
    from python_native import dsl_registry
    from python_native.core.registry import REGISTRY

    builders = _calibration_args()
    out: dict[str, list[str]] = {}
    for o in REGISTRY.overrides():
        if o.derived_from is not None or o.op not in builders or (ops and o.op not in ops):
            continue
        if not dsl_registry.available(o.dsl):
            continue
        dsls = out.setdefault(o.op, [])
        if o.dsl not in dsls:
            dsls.append(o.dsl)
    return out


@contextlib.contextmanager
def _only(dsl: str, others: Sequence[str]) -> Iterator[None]:
    """``dsl`` alone routes calls inside: the others are held off, and ``dsl`` is switched on even where
    it was disabled explicitly (the CuTe DSL installs disabled); its explicit disable is restored after."""
    from python_native import controller
    from python_native.core.registry import REGISTRY

    was_disabled = dsl in REGISTRY.switches.dsl.explicit
    if was_disabled:
        REGISTRY.enable("dsl", [dsl])
    try:
        with controller.Scope("dsl", tuple(n for n in others if n != dsl)):
            yield
    finally:
        if was_disabled:
            REGISTRY.disable("dsl", [dsl])


def calibrate(device: str, dtypes: Sequence[torch.dtype], quick: bool, ops: Sequence[str] | None = None,
              threshold: float = 1.05, progress: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Time every installed, available DSL's override against aten on this device; return a calibration table.

    Each DSL is timed alone (the other DSLs held off), so where two DSLs override an op both get
    rows, side by side, and the gates pick the faster one per size bucket. A row ``wins`` when
    aten_ms / override_ms >= ``threshold`` there and at every larger size of its row-width class
    (``calibration.confirm_wins``); shapes where the override's own cond declines are not
    measured (the gate never sees them).
    """
    import datetime

    from python_native import calibration, dsl_registry

    timer = gpu_throughput_timer() if device == "cuda" else cpu_timer()
    builders = _calibration_args()
    per_op = calibrated_dsls(ops)
    every_dsl = dsl_registry.names()
    rows: list[dict[str, Any]] = []
    with calibration.suspended():
        for symbol, dsls in per_op.items():
            op = getattr(torch.ops.aten, symbol)
            for dtype in dtypes:
                for shape in calibration_shapes(quick):
                    if symbol == "bmm" and math.prod(shape) > (1 << 21):
                        continue  # the outer product's output is 16x the input: keep memory bounded
                    x = torch.randn(*shape, device=device, dtype=dtype)
                    args = builders[symbol](x, torch.randn_like(x))
                    base: float | None = None
                    for dsl in dsls:
                        with _only(dsl, every_dsl):
                            with pn.trace() as t:
                                op(*args)
                            if not any(e.op == symbol and e.dsl == dsl and e.outcome == "override" for e in t.events):
                                continue
                            ours = timer(lambda op=op, args=args: op(*args), [])
                        if base is None:
                            with _aten_only():
                                base = timer(lambda op=op, args=args: op(*args), [])
                        speedup = base / ours if ours else 0.0
                        row = {
                            "dsl": dsl, "op": symbol, "dtype": str(dtype).removeprefix("torch."),
                            "bucket": calibration.size_bucket(args[0].numel()), "shape": list(shape),
                            "last_dim": args[0].shape[-1],
                            "override_ms": round(ours, 5), "aten_ms": round(base, 5), "speedup": round(speedup, 4),
                            "wins": speedup >= threshold,
                        }
                        rows.append(row)
                        if progress is not None:
                            progress(row)
    calibration.confirm_wins(rows, threshold)
    key = calibration.device_key(torch.device(device, torch.cuda.current_device()) if device == "cuda" else device)
    return {
        "format": calibration.FORMAT,
        "device": key,
        "torch": torch.__version__,
        "triton": str(pn.triton.version),
        "dsls": {name: str(dsl_registry.version(name)) for name in sorted({d for ds in per_op.values() for d in ds})},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "bucket": "bit_length(numel of the op's first tensor argument)",
        "threshold": threshold,
        "rows": rows,
    }
