"""Calibration runs: each overridden aten op called directly, override vs aten, per DSL, dtype and size bucket.

The table it returns is what ``python_native.features.calibration`` loads to gate each override where it wins.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

import python_native as pn
from python_native.tools.bench.timing import cpu_timer, gpu_throughput_timer

CalibArgs = Callable[[torch.Tensor, torch.Tensor], tuple]


def _ln_stats(x: torch.Tensor) -> tuple:
    n = x.shape[-1]
    w, b = torch.randn(n, device=x.device, dtype=x.dtype), torch.randn(n, device=x.device, dtype=x.dtype)
    with _aten_only():
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
    return w, b, mean, rstd


def _rms_stats(x: torch.Tensor) -> tuple:
    w = torch.randn(x.shape[-1], device=x.device, dtype=x.dtype)
    with _aten_only():
        _, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], w, 1e-6)
    return w, rstd


def _softmax_out(x: torch.Tensor, log: bool) -> torch.Tensor:
    with _aten_only():
        return (torch.ops.aten._log_softmax if log else torch.ops.aten._softmax)(x, -1, False)


def _weight(x: torch.Tensor) -> torch.Tensor:
    return torch.randn(x.shape[-1], device=x.device, dtype=x.dtype)


def _tokens(x: torch.Tensor, expand: bool) -> tuple:
    # MoE combine: four token rows per output row, each added into a random output row.
    index = torch.randint(0, x.shape[0], (4 * x.shape[0],), device=x.device)
    source = torch.randn(4 * x.shape[0], x.shape[1], device=x.device, dtype=x.dtype)
    return (x, 0, index[:, None].expand(source.shape) if expand else index, source)


def _as_channels(x: torch.Tensor) -> tuple:
    """``x`` as a group norm input: N = rows, C = 32 channels in 8 groups, HW = cols / 32."""
    rows, cols = x.shape
    return x.reshape(rows, 32, cols // 32), rows, 32, cols // 32, 8


def _gn_forward(x: torch.Tensor, dy: torch.Tensor) -> tuple:
    t, n, c, hw, g = _as_channels(x)
    return t, _weight(t[0, :, 0]), _weight(t[0, :, 0]), n, c, hw, g, 1e-5  # weight and bias: [C]


def _gn_backward(x: torch.Tensor, dy: torch.Tensor) -> tuple:
    t, w, b, n, c, hw, g, eps = _gn_forward(x, dy)
    with _aten_only():
        _, mean, rstd = torch.ops.aten.native_group_norm(t, w, b, n, c, hw, g, eps)
    return (dy.reshape(t.shape), t, mean, rstd, w, n, c, hw, g, [True, True, True])


def _calibration_args() -> dict[str, CalibArgs]:
    """Per overridden aten op: its arguments built from an input ``x`` (rows x cols) and a gradient ``dy``."""
    return {
        **_declared_args(),
        "native_layer_norm": lambda x, dy: (x, [x.shape[-1]], _weight(x), _weight(x), 1e-5),
        "native_layer_norm_backward": lambda x, dy: (
            (lambda w, b, mean, rstd: (dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True]))(*_ln_stats(x))
        ),
        "_fused_rms_norm": lambda x, dy: (x, [x.shape[-1]], _weight(x), 1e-6),
        "_fused_rms_norm_backward": lambda x, dy: (
            (lambda w, rstd: (dy, x, [x.shape[-1]], rstd, w, [True, True]))(*_rms_stats(x))
        ),
        "_softmax": lambda x, dy: (x, -1, False),
        "_log_softmax": lambda x, dy: (x, -1, False),
        "_softmax_backward_data": lambda x, dy: (dy, _softmax_out(x, False), -1, x.dtype),
        "_log_softmax_backward_data": lambda x, dy: (dy, _softmax_out(x, True), -1, x.dtype),
        "silu": lambda x, dy: (x,),
        "silu_backward": lambda x, dy: (dy, x),
        "gelu": lambda x, dy: (x,),
        "gelu_backward": lambda x, dy: (dy, x),
        # An outer product per batch entry: the first operand has as many elements as x.
        "bmm": lambda x, dy: (x.reshape(x.shape[0], x.shape[1], 1), torch.ones_like(x[:, :16]).reshape(-1, 1, 16)),
        # Reductions over the rows of x (the gate's width class is their length).
        "sum.dim_IntList": lambda x, dy: (x, [-1]), "mean.dim": lambda x, dy: (x, [-1]),
        "prod.dim_int": lambda x, dy: (x, -1), "amax": lambda x, dy: (x, [-1]), "amin": lambda x, dy: (x, [-1]),
        "argmax": lambda x, dy: (x, -1), "argmin": lambda x, dy: (x, -1), "max.dim": lambda x, dy: (x, -1),
        "min.dim": lambda x, dy: (x, -1),
        # k = 64: the sorting path, the slower of the two, so a win holds for the smaller k too.
        "topk": lambda x, dy: (x, min(64, x.shape[-1]), -1, True, True),
        "scatter_add": lambda x, dy: _tokens(x, True),
        "scatter_add_": lambda x, dy: _tokens(x, True),
        "index_add": lambda x, dy: _tokens(x, False),
        "index_add_": lambda x, dy: _tokens(x, False),
        "native_group_norm": _gn_forward,
        "native_group_norm_backward": _gn_backward,
        "native_dropout": lambda x, dy: (x, 0.1, True),
        "native_dropout_backward": lambda x, dy: (dy, torch.rand_like(x) >= 0.1, 1 / 0.9),
        "bernoulli_.float": lambda x, dy: (torch.empty_like(x), 0.9),
    }


# Qwen3-MoE's routing: 128 experts, 8 per token, renormalised. Its layer's proportions (Qwen3-30B-A3B:
# hidden 2048, experts 768 wide, 128 experts, 8 per token) scale the experts' calls to the bucket.
MOE_EXPERTS, MOE_TOP_K = 128, 8
MOE_ROUTE_OPTIONS = ("softmax", False, True, 0.0, None, 1, 1, 1.0, False)
MOE_WEIGHTS = 1 << 30  # the most stacked expert weights a call builds (2 GiB in bfloat16)


def _moe_route(x: torch.Tensor, dy: torch.Tensor, backward: bool) -> tuple:
    """x as a router's logits (tokens, 128 experts); the backward's gradient and indices from one forward."""
    logits = x.reshape(-1, MOE_EXPERTS)
    if not backward:
        return (logits, MOE_TOP_K, *MOE_ROUTE_OPTIONS)
    with _aten_only():
        weights, indices = aten_op("moe_route")(logits, MOE_TOP_K, *MOE_ROUTE_OPTIONS)
    grad = dy.reshape(-1)[:weights.numel()].view_as(weights).to(weights.dtype)
    return (grad, logits, indices, MOE_TOP_K, *MOE_ROUTE_OPTIONS)


def moe_layer(hidden: int) -> tuple[int, int, int]:
    """(intermediate, experts, top-k) of the scaled layer: 3/8 of ``hidden`` wide; hidden/16 experts
    (Qwen3-30B-A3B's 128 at 2048), fewer where their weights would pass ``MOE_WEIGHTS``, 4 to 128;
    one in 16 chosen, at least 2. 1024 wide: 64 experts, 4 chosen; 8192 wide: 8 experts, 2 (Mixtral's)."""
    inner = max(8, hidden * 3 // 8)
    fits = MOE_WEIGHTS // (3 * inner * hidden)
    experts = max(4, min(MOE_EXPERTS, hidden // 16, 1 << max(fits.bit_length() - 1, 0)))
    return inner, experts, max(2, experts // 16)


def _moe_experts(x: torch.Tensor, dy: torch.Tensor, backward: bool) -> tuple:
    """x as a layer's hidden states (tokens, hidden), each token routed to distinct experts; weights scaled
    by 1/sqrt(fan-in) so that half precision stays in range."""
    tokens, hidden = x.shape
    inner, experts, top_k = moe_layer(hidden)
    device, dtype = x.device, x.dtype
    indices = torch.rand(tokens, experts, device=device).argsort(1)[:, :top_k]
    weights = torch.rand(tokens, top_k, device=device, dtype=dtype)
    gate_up = torch.randn(experts, 2 * inner, hidden, device=device, dtype=dtype) / hidden ** 0.5
    down = torch.randn(experts, hidden, inner, device=device, dtype=dtype) / inner ** 0.5
    args = (x, indices, weights, gate_up, down, None, None, "silu", False, False, 7.0, 1.702, "sum")
    return (dy, *args) if backward else args


def _declared_args() -> dict[str, CalibArgs]:
    """The ops of ``python_native.ops`` model patching calls (``DECLARED``), from the same ``x`` and ``dy``:
    the norm in Llama's casting mode, gated activations on two operands shaped as x, rotary on x as
    one sequence of 128-wide heads (a quarter as many key heads), the MoE ops at Qwen3-MoE's routing."""
    def other(x: torch.Tensor) -> torch.Tensor:
        return torch.randn_like(x)

    def heads(x: torch.Tensor) -> tuple:
        rows, cols = x.shape
        d = min(cols, 128)
        q = x.reshape(1, rows, cols // d, d).transpose(1, 2)
        k = torch.randn(1, rows, max(1, cols // d // 4), d, device=x.device, dtype=x.dtype).transpose(1, 2)
        cos = torch.randn(1, rows, d, device=x.device, dtype=x.dtype)
        return q, k, cos, torch.randn_like(cos)

    return {
        "rms_norm": lambda x, dy: (x, other(x[0]), 1e-6, 0.0, False),
        "rms_norm_backward": lambda x, dy: (dy, x, other(x[0]), 1e-6, 0.0, False),
        "swiglu": lambda x, dy: (x, other(x)), "swiglu_backward": lambda x, dy: (dy, x, other(x)),
        "geglu": lambda x, dy: (x, other(x), "tanh"), "geglu_backward": lambda x, dy: (dy, x, other(x), "tanh"),
        "rotary": lambda x, dy: (*heads(x), 1),
        "rotary_backward": lambda x, dy: (*heads(x), 1),
        "gelu_tanh": lambda x, dy: (x,), "gelu_tanh_backward": lambda x, dy: (dy, x),
        "quick_gelu": lambda x, dy: (x,), "quick_gelu_backward": lambda x, dy: (dy, x),
        "moe_route": lambda x, dy: _moe_route(x, dy, False), "moe_route_backward": lambda x, dy: _moe_route(x, dy, True),
        "moe_experts": lambda x, dy: _moe_experts(x, dy, False),
        "moe_experts_backward": lambda x, dy: _moe_experts(x, dy, True),
    }


# Calibrated ops of the ``python_native`` namespace (``python_native.ops``), by their symbol.
DECLARED = frozenset({"rms_norm", "rms_norm_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward",
                      "rotary", "rotary_backward", "gelu_tanh", "gelu_tanh_backward", "quick_gelu",
                      "quick_gelu_backward", "moe_route", "moe_route_backward", "moe_experts", "moe_experts_backward"})


def aten_op(symbol: str) -> Any:
    """The overload packet's entry for ``symbol`` (``_softmax``, ``sum.dim_IntList``; the ops of
    ``DECLARED`` in the ``python_native`` namespace)."""
    packet, _, overload = symbol.partition(".")
    namespace = torch.ops.python_native if symbol in DECLARED else torch.ops.aten
    return getattr(getattr(namespace, packet), overload or "default")


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
    from python_native.foundations import dsl_registry
    from python_native.panel import controller

    return controller.Scope("dsl", tuple(dsl_registry.names()))


def calibrated_dsls(ops: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Per aten op symbol with a calibration builder: the installed, available DSLs overriding it (in slot order)."""
    from python_native.core.registry import REGISTRY
    from python_native.foundations import dsl_registry

    builders = _calibration_args()
    out: dict[str, list[str]] = {}
    for o in REGISTRY.overrides():
        if o.derived_from is not None or o.op not in builders or (ops and o.op not in ops):
            continue
        if o.lib != ("python_native" if o.op in DECLARED else "aten"):
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
    from python_native.core.registry import REGISTRY
    from python_native.panel import controller

    was_disabled = dsl in REGISTRY.switches.dsl.explicit
    if was_disabled:
        REGISTRY.enable("dsl", [dsl])
    try:
        with controller.Scope("dsl", tuple(n for n in others if n != dsl)):
            yield
    finally:
        if was_disabled:
            REGISTRY.disable("dsl", [dsl])


Step = tuple  # (aten op symbol, its DSLs, dtype, shape)


def calibration_steps(dtypes: Sequence[torch.dtype], quick: bool, ops: Sequence[str] | None = None) -> list[Step]:
    """What a calibration run measures, in order: per op, dtype and shape, every DSL overriding the op."""
    steps = []
    for symbol, dsls in calibrated_dsls(ops).items():
        for dtype in dtypes:
            for shape in calibration_shapes(quick):
                if symbol == "bmm" and math.prod(shape) > (1 << 21):
                    continue  # the outer product's output is 16x the input: keep memory bounded
                steps.append((symbol, dsls, dtype, shape))
    return steps


def device_properties(device: str) -> dict[str, float] | None:
    """What the portable policy scales by, for the GPU being calibrated (NVML, else torch's properties)."""
    if device != "cuda":
        return None
    from python_native.features import calibration
    from python_native.foundations import nvml

    index = torch.cuda.current_device()
    props: dict[str, float] = dict(nvml.properties(calibration.device_key(torch.device("cuda", index))) or {})
    p = torch.cuda.get_device_properties(index)
    props.setdefault("sm_count", p.multi_processor_count)
    bus, clock_khz = getattr(p, "memory_bus_width", 0), getattr(p, "memory_clock_rate", 0)
    if bus and clock_khz:
        props.setdefault("memory_bandwidth_gbps", round(bus / 8 * clock_khz * 2 / 1e6, 1))
    return props


Progress = Callable[[dict | None, int, int], None]  # (row, or None for a step not measured; done; total)


def _measure_step(symbol: str, dsls: Sequence[str], dtype: torch.dtype, args: tuple, every_dsl: list[str], timer,
                  threshold: float) -> dict[str, dict[str, Any]]:
    """One op at one shape: each DSL's override timed alone against aten (measured once, where some
    override fired), as calibration rows by DSL; a DSL whose cond declined the call has none."""
    from python_native.features import calibration

    op = aten_op(symbol)
    base: float | None = None
    rows: dict[str, dict[str, Any]] = {}
    for dsl in dsls:
        with _only(dsl, every_dsl):
            with pn.trace() as t:
                op(*args)
            fired = any(e.op == symbol and e.dsl == dsl and e.outcome == "override" for e in t.events)
            ours = timer(lambda: op(*args), []) if fired else None
        if ours is None:
            continue
        if base is None:
            with _aten_only():
                base = timer(lambda: op(*args), [])
        speedup = base / ours if ours else 0.0
        rows[dsl] = {
            "dsl": dsl, "op": symbol, "dtype": str(dtype).removeprefix("torch."),
            "bucket": calibration.size_bucket(args[0].numel()), "shape": None, "last_dim": args[0].shape[-1],
            "override_ms": round(ours, 5), "aten_ms": round(base, 5), "speedup": round(speedup, 4),
            "wins": speedup >= threshold,
        }
    return rows


def calibrate(device: str, dtypes: Sequence[torch.dtype], quick: bool, ops: Sequence[str] | None = None,
              threshold: float = 1.05, progress: Progress | None = None) -> dict[str, Any]:
    """Time every installed, available DSL's override against aten on this device; return a calibration table.

    Each DSL is timed alone (the other DSLs held off), so where two DSLs override an op both get
    rows, side by side, and the gates pick the faster one per size bucket. A row ``wins`` when
    aten_ms / override_ms >= ``threshold`` there and at every larger size of its row-width class
    (``calibration.confirm_wins``); shapes where the override's own cond declines are not
    measured (the gate never sees them). ``progress`` hears of each (DSL, shape) step.
    """
    import datetime

    from python_native.features import calibration
    from python_native.foundations import dsl_registry

    timer = gpu_throughput_timer() if device == "cuda" else cpu_timer()
    builders = _calibration_args()
    steps = calibration_steps(dtypes, quick, ops)
    total, done = sum(len(dsls) for _, dsls, _, _ in steps), 0
    every_dsl = dsl_registry.names()
    rows: list[dict[str, Any]] = []
    with calibration.suspended():
        for symbol, dsls, dtype, shape in steps:
            x = torch.randn(*shape, device=device, dtype=dtype)
            args = builders[symbol](x, torch.randn_like(x))
            measured = _measure_step(symbol, dsls, dtype, args, every_dsl, timer, threshold)
            for dsl in dsls:
                row = measured.get(dsl)
                if row is not None:
                    row["shape"] = list(shape)
                    rows.append(row)
                done += 1
                if progress is not None:
                    progress(row, done, total)
    calibration.confirm_wins(rows, threshold)
    key = calibration.device_key(torch.device(device, torch.cuda.current_device()) if device == "cuda" else device)
    table = {
        "format": calibration.FORMAT,
        "device": key,
        "torch": torch.__version__,
        "triton": str(pn.triton.version),
        "dsls": {name: str(dsl_registry.version(name)) for name in sorted({d for _, ds, _, _ in steps for d in ds})},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "bucket": "bit_length(numel of the op's first tensor argument)",
        "threshold": threshold,
        "rows": rows,
    }
    kernels = calibration.versions.table_entry({(row["dsl"], row["op"]) for row in rows})
    if kernels:  # the kernels timed: rows count as unmeasured once these sources change
        table["kernels"] = kernels
    props = device_properties(device)
    if props:
        table["device_properties"] = props
    return table
