"""Measuring rows: one case's override against aten and its peers, the run over all cases, its environment,
and the command's choices (device, dtypes, ops) checked."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

import python_native as pn
from python_native.panel import snapshot
from python_native.tools.bench.peers import competitors
from python_native.tools.bench.rows import OPS, Case, Inputs, Row, backward, bytes_moved, make_inputs, torch_function
from python_native.tools.bench.timing import Fn, Timer, cpu_timer, gpu_timer


def runner(case: Case, fn: Callable[[Inputs], torch.Tensor], inputs: Inputs) -> Fn:
    if case.mode == "fwd":
        return lambda: fn(inputs)
    return lambda: backward(fn(inputs), inputs.dy)


def _fired_overrides(fn: Fn) -> list:
    """The functional Triton overrides ``fn`` fires, in call order."""
    with pn.trace() as t:
        fn()
    names = dict.fromkeys(e.override for e in t.events if e.dsl == "triton" and e.outcome == "override")
    by_name = {o.name: o.functional for o in pn.overrides()}
    return list(dict.fromkeys(by_name[n] for n in names if n in by_name))


def _time_variants(row: Row, fn: Fn, fired: list, timer: Timer, inputs: Inputs) -> None:
    """One cell per variant the fired overrides declare besides their default (``--variants``)."""
    for variant in dict.fromkeys(v for o in fired for v in o.variants if v != "default"):
        scopes = [pn.override_variant(o.op, variant) for o in fired if variant in o.variants]
        try:
            with contextlib.ExitStack() as stack:
                for scope in scopes:
                    stack.enter_context(scope)
                row.variants_ms[variant] = timer(fn, inputs.leaves)
        except Exception as e:  # a variant that rejects this case costs its cell, not the run
            row.notes.append(f"variant {variant}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")


def measure_case(case: Case, device: str, timer: Timer, bandwidth: float | None, inductor: bool,
                 variants: bool = False) -> Row:
    inputs = make_inputs(case, device)
    fn = runner(case, torch_function(case.op), inputs)
    fired_overrides = _fired_overrides(fn)
    fired = bool(fired_overrides)
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
    if variants:
        _time_variants(row, fn, fired_overrides, timer, inputs)
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
        from python_native.features import calibration

        info["device_name"] = calibration.device_key(torch.device("cuda", torch.cuda.current_device()))
    else:
        info["device_name"] = "cpu (Triton interpreter)"
    return info


def run_rows(cases_: Sequence[Case], device: str, inductor: bool, progress: Callable[[Row], None] | None = None,
             bandwidth: float | None = None, variants: bool = False) -> list[Row]:
    timer = gpu_timer() if device == "cuda" else cpu_timer()
    rows = []
    for case in cases_:
        row = measure_case(case, device, timer, bandwidth, inductor, variants)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


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
        hint = snapshot.interpreter_hint()
        raise RuntimeError(f"triton DSL unavailable: {pn.triton.unavailable_reason}" + (f"; {hint}" if hint else ""))
    from python_native_dsls.triton import device_type

    device = device_type()
    if device == "cpu" and not quick:
        print("warning: no GPU; full shapes through Triton's interpreter take minutes (use --quick)", file=sys.stderr)
    return device
