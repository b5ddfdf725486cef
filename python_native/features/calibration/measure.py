"""Measuring on first use: an override against aten on a call's own arguments, once per cell.

A gate whose verdict for a call is ``first_use.MEASURE`` (and whose cond accepted it) asks
``decide``. In order:

1. Inside a CUDA graph capture or a ``torch.compile`` trace nothing is measured: the verdict that
   stood before (a table's, the portable policy's; aten where none speaks) answers.
2. One thread per process measures a cell; another thread meeting it meanwhile does not wait:
   its call goes by the verdict that stood before.
3. The user's table is read first: a verdict another process (a rank of the same job) wrote for
   the cell is adopted without measuring.
4. Otherwise the override and aten's kernel run on the call's arguments (arguments the op writes
   are cloned first; torch's random state is restored after): one warm-up call each (the
   override's first call compiles its kernel), one call each to size the repeats, then at most
   ``BUDGET_MS`` of back-to-back calls timed with CUDA events, in alternating rounds; outputs are
   discarded. The override wins where aten takes ``THRESHOLD`` times as long.
5. The verdict is written into the user's table unless a first-use verdict for the cell is there
   already (then that one is kept, so every process sharing the folder keeps the same verdict),
   logged (``TORCH_LOGS=+python_native``), and the call is answered by the winner.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from python_native.features.calibration import first_use, resolve, sources, store, tables, versions
from python_native.foundations import dsl_registry, scalars
from python_native.foundations.codegen import PLAN_KEYWORD

log = logging.getLogger("python_native")

THRESHOLD = 1.05  # as `bench --calibrate`: an override fires where aten takes 5% longer
BUDGET_MS = 20.0  # timed calls per cell, beyond one warm-up and one sizing call of each side
ROUNDS = 3

Call = Callable[[], Any]
Timer = Callable[[Call, Call, Any], tuple[float, float]]  # (override, aten, a tensor of the call) -> ms each
_timer: Timer | None = None
_unwritable_said = False  # the user's folder could not be written: said once, at warning level


def set_timer(fn: Timer | None) -> None:
    """Replace how a cell is timed (tests fake the clock); None restores CUDA events."""
    global _timer
    _timer = fn


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (no CUDA initialised: none is)."""
    import torch

    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def decide(gate: Any, t: Any, args: tuple, kwargs: dict, accepted: Any) -> Any:
    """A gate's answer for a call in a cell to measure: ``accepted`` where the override wins, else False."""
    handle = gate.handle()
    device = resolve.device_key(t.device)
    dtype = str(t.dtype).removeprefix("torch.")
    cell = tables.cell_of(t)
    key = (device, gate.dsl, gate.op, dtype, cell)
    if handle is None or handle.derived_from is not None or capturing() or compiling():
        return _standing(key, accepted)
    claimed = first_use.claim(key)
    if claimed is None:
        return _standing(key, accepted)
    if claimed is not first_use.TAKEN:
        return accepted if claimed else False
    won: bool | None = None
    try:
        won = _measured(key, handle, t, args, kwargs, accepted)
    except Exception as e:  # the call itself must not fail: aten answers, nothing is kept on disk
        log.warning("python_native: first use of %s %s %s could not be measured (%s: %s); aten serves it",
                    gate.dsl, gate.op, _cell_text(dtype, cell), type(e).__name__, e)
        won = False
    finally:
        first_use.learn(key, won)
    gate.relearn(dtype)
    return accepted if won else False


def _standing(key: tuple, accepted: Any) -> Any:
    """The answer of the verdict that stood before measuring (aten where nothing speaks)."""
    device, dsl, op, dtype, cell = key
    found = resolve.resolution(device).verdicts(dsl, op, dtype, measuring=False)
    return accepted if found is not None and found[cell] is not False else False


def _measured(key: tuple, handle: Any, t: Any, args: tuple, kwargs: dict, plan: Any) -> bool:
    device, dsl, op, dtype, cell = key
    version = versions.current(dsl, op)
    known = _in_file(key, version)
    if known is not None:
        log.debug("python_native: first use: %s %s %s on %s: adopted %s from the user's table",
                  dsl, op, _cell_text(dtype, cell), device, "override" if known else "aten")
        return known
    ours_ms, aten_ms = _time(handle, t, args, kwargs, plan)
    speedup = aten_ms / ours_ms if ours_ms > 0 else 0.0
    row = {"dsl": dsl, "op": op, "dtype": dtype, "bucket": cell // 2, "shape": list(t.shape),
           "last_dim": int(t.shape[-1]) if t.ndim else 0, "override_ms": round(ours_ms, 5),
           "aten_ms": round(aten_ms, 5), "speedup": round(speedup, 4), "wins": speedup >= THRESHOLD,
           "first_use": True}
    if version is not None:
        row["kernel"] = version
    won = _record(device, row)
    log.debug("python_native: first use: %s %s %s on %s: override %.4f ms, aten %.4f ms (%.2fx): %s fires",
              dsl, op, _cell_text(dtype, cell), device, ours_ms, aten_ms, speedup, "the override" if won else "aten")
    return won


def _cell_text(dtype: str, cell: int) -> str:
    return f"{dtype} size bucket {cell // 2} ({'wide' if cell % 2 else 'narrow'} rows)"


# ----- timing -----


def _time(handle: Any, t: Any, args: tuple, kwargs: dict, plan: Any) -> tuple[float, float]:
    """(override ms, aten ms) per call on copies of what the op writes, torch's random state kept."""
    import torch

    slot = handle.slot
    fallback = slot.namespace["_pn_fallback"]
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, handle.dispatch_key))
    impl, takes_plan = handle.chosen_impl, handle.takes_plan
    ours_args, ours_kwargs = _scratch(slot.sig, args, kwargs, coerce=False)
    aten_args, aten_kwargs = _scratch(slot.sig, args, kwargs, coerce=True)
    if takes_plan:
        ours_kwargs[PLAN_KEYWORD] = plan

    def ours() -> None:
        impl(*ours_args, **ours_kwargs)

    def aten() -> None:
        fallback.call_boxed(keyset, *aten_args, **aten_kwargs)

    devices = [t.device.index if t.device.index is not None else torch.cuda.current_device()] if t.is_cuda else []
    with torch.random.fork_rng(devices=devices):
        return (_timer or _clock_time)(ours, aten, t)


def _scratch(sig: Any, args: tuple, kwargs: dict, coerce: bool) -> tuple[list, dict]:
    """The call's arguments, those the op writes cloned (and, for aten, numbers in Tensor places wrapped)."""
    import torch

    def own(param: Any, value: Any) -> Any:
        return value.clone() if param is not None and param.mutable and isinstance(value, torch.Tensor) else value

    positional = sig.positional
    out = [own(positional[i] if i < len(positional) else None, a) for i, a in enumerate(args)]
    named = {p.name: p for p in sig.keyword_only}
    kw = {k: own(named.get(k), v) for k, v in kwargs.items()}
    if coerce:
        peers = [a for a in out if isinstance(a, torch.Tensor)]
        out = [scalars.coerce(a, peers) if i < len(positional) and positional[i].tensor and not positional[i].is_out
               else a for i, a in enumerate(out)]
    return out, kw


def _clock_time(ours: Call, aten: Call, t: Any) -> tuple[float, float]:
    """CUDA events around back-to-back calls (host time where the tensors are not on a GPU)."""
    clock = _cuda_clock if t.is_cuda else _host_clock
    ours()
    aten()
    one = max(clock(ours, 1), clock(aten, 1), 1e-4)
    rounds = max(1, min(ROUNDS, int(BUDGET_MS / (2 * one))))
    n = max(1, int(BUDGET_MS / (2 * rounds * one)))
    mine, theirs = [], []
    for _ in range(rounds):
        mine.append(clock(ours, n))
        theirs.append(clock(aten, n))
    return statistics.median(mine), statistics.median(theirs)


def _cuda_clock(fn: Call, n: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def _host_clock(fn: Call, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) * 1e3 / n


# ----- the user's table -----


def _header(device: str, dsl: str) -> dict[str, Any]:
    import torch

    version = dsl_registry.version(dsl) if dsl_registry.is_known(dsl) else None
    return {"format": tables.FORMAT, "device": device, "torch": torch.__version__,
            "dsls": {dsl: str(version) if version is not None else "unknown"},
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "bucket": "bit_length(numel of the op's first tensor argument)", "threshold": THRESHOLD, "rows": []}


def _filename(device: str, dsl: str) -> str:
    header = _header(device, dsl)
    return sources.user_table_filename(device, sources.table_versions(header))


def _cell_rows(table: dict[str, Any] | None, key: tuple, version: str | None) -> list[dict[str, Any]]:
    """The first-use rows of ``table`` for the cell of ``key``, timed with kernel ``version``."""
    device, dsl, op, dtype, cell = key
    if table is None or table.get("device") != device:
        return []
    return [r for r in table["rows"] if r.get("first_use") and r.get("dsl", tables.DEFAULT_DSL) == dsl
            and r["op"] == op and r["dtype"] == dtype and r.get("kernel") == version
            and cell in [2 * r["bucket"] + w for w in tables.row_classes(r)]]


def _in_file(key: tuple, version: str | None) -> bool | None:
    """The verdict another process wrote for the cell (None: none), read under the folder's lock."""
    try:
        found = _cell_rows(store.update_user_table(_filename(key[0], key[1]), lambda table: None), key, version)
    except (OSError, ValueError):
        return None
    return all(r["wins"] is True for r in found) if found else None


def _record(device: str, row: dict[str, Any]) -> bool:
    """Add ``row`` to the user's table unless the cell has a first-use verdict there already; the
    verdict the file holds afterwards (the first one written) is the one kept. A folder that cannot
    be written keeps the verdict in this process only (said once in the log)."""
    key = (device, row["dsl"], row["op"], row["dtype"], 2 * row["bucket"] + tables.width_class(row["last_dim"]))

    def change(table: dict[str, Any] | None) -> dict[str, Any] | None:
        if _cell_rows(table, key, row.get("kernel")):
            return None
        fresh = table if table is not None and table.get("device") == device else _header(device, row["dsl"])
        return {**fresh, "rows": [*fresh["rows"], row]}

    try:
        found = _cell_rows(store.update_user_table(_filename(device, row["dsl"]), change), key, row.get("kernel"))
    except (OSError, ValueError) as e:
        global _unwritable_said
        (log.debug if _unwritable_said else log.warning)(
            "python_native: a first-use verdict could not be written to the user's calibration table (%s); "
            "verdicts hold in this process only", e)
        _unwritable_said = True
        return bool(row["wins"])
    return all(r["wins"] is True for r in found) if found else bool(row["wins"])
