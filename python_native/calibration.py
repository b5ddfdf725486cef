"""Calibration tables: where, on a given GPU, an override measured slower than aten.

``python -m python_native bench --calibrate`` times every override against aten per
(op, dtype, size bucket) on the running device and writes a JSON table. Tables shipped with the
package live in ``python_native/calibration_tables/``; ``PYTHON_NATIVE_CALIBRATION`` names a table
file (or a folder of them) to use instead.

A table is keyed by device (``"<torch.cuda.get_device_name>/sm<major><minor>"``, or ``"cpu"`` for
Triton's interpreter). Nothing is read at import: the files are parsed on first use, and the device
key of a CUDA tensor is asked of torch the first time a gated cond sees that device index (CUDA is
initialised by then, since the tensor lives there).

Width class: narrow or wide rows (the last dim of that argument below or at least ``WIDE_ROW``):
row kernels can lose on narrow rows and win on wide ones of the same size, so each (bucket, class)
has its own verdict. Rows record the last dim they were measured at (``last_dim``).

Size bucket: ``numel.bit_length()`` of the op's first tensor argument, i.e. ``floor(log2(numel)) + 1``
(0 for empty tensors). It costs a numel() call and an int bit_length, and norms/softmaxes/activations are bandwidth
bound, so their cost follows the element count. Buckets outside the calibrated range take the
verdict of the nearest calibrated bucket of the same (op, dtype).

``wins(op, dtype, bucket)`` answers ``True``/``False`` from the table in force for the device, or
``None`` where nothing was calibrated (the override's own cond decides, as without a table).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from python_native import env, nvml
from python_native.core import extensions
from python_native.core.registry import REGISTRY

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

ENV_VAR = env.CALIBRATION[0]
DEFAULT_DSL = "triton"  # the DSL of rows that name none
FORMAT = 1
MAX_BUCKET = 64
PACKAGED_DIR = Path(__file__).with_name("calibration_tables")

# device key -> {(op, dtype name) -> {dsl -> 2 * (MAX_BUCKET + 1) verdicts}}; None until first loaded.
_tables: dict[str, dict[tuple[str, str], dict[str, Verdicts]]] | None = None
_sources: dict[str, dict[str, Any]] = {}  # device key -> {"path", "rows", "torch", "triton", "date"}
_device_keys: dict[Any, str] = {}  # torch.device -> device key
_device_key_fn: Callable[[Any], str] | None = None
_lock = threading.Lock()
_suspended = False  # True while `bench --calibrate` measures: every gate lets the override run


def table_paths() -> list[Path]:
    """The table files in force: the ``PYTHON_NATIVE_CALIBRATION`` file/folder, else the packaged ones."""
    configured = env.calibration_path() or ""
    if configured:
        path = Path(configured).expanduser()
        if path.is_dir():
            return sorted(path.glob("*.json"))
        if not path.is_file():
            raise FileNotFoundError(f"{ENV_VAR}={configured!r}: no such calibration table file or folder")
        return [path]
    return sorted(PACKAGED_DIR.glob("*.json")) if PACKAGED_DIR.is_dir() else []


def any_tables() -> bool:
    """Whether any table is in force (a directory listing, no parsing): gates are bound only then."""
    try:
        return bool(table_paths())
    except FileNotFoundError:
        return False


def gates_needed(dispatch_key: str) -> bool:
    """Whether overrides installed at ``dispatch_key`` need gates: some table in force could apply here.

    Tables named by ``PYTHON_NATIVE_CALIBRATION`` always do. Of the packaged ones, only a table for
    a device this machine has: ``"cpu"`` for the interpreter's CPU key, and at the CUDA key the GPU
    models NVML names (all tables when NVML cannot tell). Elsewhere the conds are bound unwrapped
    and cost nothing extra.
    """
    if not any_tables():
        return False
    if env.calibration_path():
        return True
    # Packaged tables are named after their device (``table_filename``; a test holds them to it),
    # so nothing is parsed here: registration runs inside ``import torch``.
    names = {path.name for path in table_paths()}
    if dispatch_key == "CPU":
        return table_filename("cpu") in names
    if dispatch_key != "CUDA":
        return True
    keys = nvml.device_keys()
    return keys is None or any(table_filename(key) in names for key in keys)


def table_filename(device_key: str) -> str:
    """A file name for a device key: ``NVIDIA H100 80GB HBM3/sm90`` -> ``nvidia_h100_80gb_hbm3_sm90.json``."""
    slug = "".join(c if c.isalnum() else "_" for c in device_key.lower())
    return "_".join(part for part in slug.split("_") if part) + ".json"


def validate(table: dict[str, Any], source: str = "table") -> None:
    """Raise ``ValueError`` naming what is wrong with a table read from ``source``."""
    if not isinstance(table, dict) or table.get("format") != FORMAT:
        raise ValueError(f"{source}: not a calibration table of format {FORMAT} (got format {table.get('format')!r})")
    if not isinstance(table.get("device"), str) or not table["device"]:
        raise ValueError(f"{source}: 'device' must be a non-empty string, got {table.get('device')!r}")
    rows = table.get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"{source}: 'rows' must be a list, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        missing = {"op", "dtype", "bucket", "wins"} - set(row) if isinstance(row, dict) else {"row"}
        if missing:
            raise ValueError(f"{source}: row {i} lacks {sorted(missing)}")
        if not isinstance(row["bucket"], int) or not 0 <= row["bucket"] <= MAX_BUCKET:
            raise ValueError(f"{source}: row {i} bucket {row['bucket']!r} is not an int in 0..{MAX_BUCKET}")


# Per (bucket, width class) at index ``2 * bucket + wide``: False (loses to aten) or the DSLs
# calibrated faster, fastest first.
Verdicts = tuple
# Rows at least this long (the last dim of the op's first tensor argument) are "wide": row kernels
# win or lose differently on narrow and wide rows of the same element count.
WIDE_ROW = 4096


def width_class(last_dim: int | None) -> int:
    """0 for narrow rows, 1 for wide ones (``last_dim >= WIDE_ROW``)."""
    return 1 if last_dim is not None and last_dim >= WIDE_ROW else 0


def _row_classes(row: dict[str, Any]) -> tuple[int, ...]:
    """The width classes a table row speaks for: from its ``last_dim`` (the op's first tensor
    argument's last dim), else its ``shape``; both classes for rows that have neither."""
    last = row.get("last_dim")
    if last is None and isinstance(row.get("shape"), list) and row["shape"]:
        last = row["shape"][-1]
    return (0, 1) if not isinstance(last, int) else (width_class(last),)


def _speedup(row: dict[str, Any]) -> float:
    """aten time over override time for a row (rows without timings rank by their verdict alone)."""
    if isinstance(row.get("speedup"), (int, float)):
        return float(row["speedup"])
    ours, base = row.get("override_ms"), row.get("aten_ms")
    if isinstance(ours, (int, float)) and isinstance(base, (int, float)) and ours > 0:
        return base / ours
    return 1.0


def _filled(measured: dict[int, Any]) -> list[Any]:
    """``measured``'s value at the nearest calibrated bucket (ties go low), for every bucket 0..MAX_BUCKET."""
    order = sorted(measured)
    out = []
    for bucket in range(MAX_BUCKET + 1):
        i = bisect.bisect_left(order, bucket)
        if i == len(order) or (i > 0 and bucket - order[i - 1] <= order[i] - bucket):
            i -= 1
        out.append(measured[order[i]])
    return out


def _verdicts(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Verdicts]]:
    """Per (op, dtype), per DSL, one verdict per (bucket 0..MAX_BUCKET, width class), each filled
    from the nearest calibrated bucket of its class (of the other class where its own has no rows).

    A DSL's verdict is False where it loses to aten, else the tuple of the other DSLs that also beat
    aten there and were measured faster (fastest first): its gate declines while one of those can serve.
    Rows without a ``dsl`` (tables written before several DSLs were calibrated) are Triton's.
    """
    by_key: dict[tuple[str, str], dict[str, tuple[dict[int, tuple], dict[int, tuple]]]] = {}
    for row in rows:
        per_dsl = by_key.setdefault((row["op"], row["dtype"]), {})
        classes = per_dsl.setdefault(row.get("dsl", DEFAULT_DSL), ({}, {}))
        for wide in _row_classes(row):
            measured = classes[wide]
            # Several shapes in one (bucket, class): the override wins there only if it won for all.
            won, speedups = measured.get(row["bucket"], (True, []))
            measured[row["bucket"]] = (won and bool(row["wins"]), [*speedups, _speedup(row)])
    out: dict[tuple[str, str], dict[str, Verdicts]] = {}
    for key, per_dsl in by_key.items():
        filled = {}
        for dsl, classes in per_dsl.items():
            narrow, wide = (_filled(classes[c] or classes[1 - c]) for c in (0, 1))
            filled[dsl] = [(won, sum(s) / len(s)) for pair in zip(narrow, wide, strict=True) for won, s in pair]
        out[key] = {}
        for dsl, buckets in filled.items():
            verdicts = []
            for i, (won, speed) in enumerate(buckets):
                if not won:
                    verdicts.append(False)
                    continue
                rivals = [(other[i][1], name) for name, other in filled.items()
                          if name != dsl and other[i][0] and (other[i][1], name) > (speed, dsl)]
                verdicts.append(tuple(name for _, name in sorted(rivals, reverse=True)))
            out[key][dsl] = tuple(verdicts)
    return out


def confirm_wins(rows: list[dict[str, Any]], threshold: float) -> None:
    """Set each measured row's ``wins``: its cell (DSL, op, dtype, width class, bucket; every shape
    of the bucket) beat aten by ``threshold``, and so did each larger calibrated bucket of that
    cell's class. An override's edge grows with size as its host cost is amortized, so a lone
    "win" below a loss is the timer's noise. The largest bucket has no larger one to confirm it:
    there the win must clear twice the margin, or the next smaller bucket must win too.
    """
    cells: dict[tuple, dict[int, float]] = {}
    for row in rows:
        if not isinstance(row.get("speedup"), (int, float)):
            continue
        for wide in _row_classes(row):
            cell = cells.setdefault((row.get("dsl", DEFAULT_DSL), row["op"], row["dtype"], wide), {})
            cell[row["bucket"]] = min(cell.get(row["bucket"], float("inf")), float(row["speedup"]))
    confirmed: dict[tuple, bool] = {}
    for key, speedups in cells.items():
        larger_won = True
        order = sorted(speedups, reverse=True)
        for i, bucket in enumerate(order):
            won = speedups[bucket] >= threshold and larger_won
            if i == 0 and len(order) > 1:
                won = won and (speedups[bucket] >= 2 * threshold - 1 or speedups[order[1]] >= threshold)
            confirmed[(*key, bucket)] = larger_won = won
    for row in rows:
        if isinstance(row.get("speedup"), (int, float)):
            key = (row.get("dsl", DEFAULT_DSL), row["op"], row["dtype"])
            row["wins"] = all(confirmed[(*key, wide, row["bucket"])] for wide in _row_classes(row))


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate one table file."""
    with open(path) as f:
        table = json.load(f)
    validate(table, str(path))
    return table


def _ensure_loaded() -> dict[str, dict[tuple[str, str], dict[str, Verdicts]]]:
    global _tables
    tables = _tables
    if tables is not None:
        return tables
    with _lock:
        if _tables is None:
            loaded: dict[str, dict[tuple[str, str], dict[str, Verdicts]]] = {}
            for path in table_paths():
                table = load(path)
                loaded[table["device"]] = _verdicts(table["rows"])
                _sources[table["device"]] = {
                    "path": str(path),
                    "rows": len(table["rows"]),
                    **{k: table.get(k) for k in ("torch", "triton", "date")},
                }
            _tables = loaded
        return _tables


def reset() -> None:
    """Forget loaded tables and device keys (after changing ``PYTHON_NATIVE_CALIBRATION``; tests)."""
    global _tables
    with _lock:
        _tables = None
        _sources.clear()
        _device_keys.clear()
        for cache in _gate_caches:
            cache.clear()


def set_device_key_fn(fn: Callable[[Any], str] | None) -> None:
    """Replace how a tensor's device key is computed (tests inject fake devices); None restores."""
    global _device_key_fn
    _device_key_fn = fn
    reset()


def device_key(device: Any) -> str:
    """``"<name>/sm<cc>"`` for a CUDA device, ``"cpu"`` otherwise; cached per device."""
    import torch

    device = torch.device(device)
    key = _device_keys.get(device)
    if key is None:
        if _device_key_fn is not None:
            key = _device_key_fn(device)
        elif device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            key = f"{torch.cuda.get_device_name(device)}/sm{major}{minor}"
        else:
            key = device.type
        _device_keys[device] = key
    return key


def size_bucket(numel: int) -> int:
    """The size bucket of a problem of ``numel`` elements: ``floor(log2(numel)) + 1``, capped."""
    return min(int(numel).bit_length(), MAX_BUCKET)


def wins(op: str, dtype: str, bucket: int, device: str | None = None, dsl: str = DEFAULT_DSL,
         last_dim: int | None = None) -> bool | None:
    """Whether ``dsl``'s override beat aten for (op, dtype, bucket) on ``device`` (a device key; default:
    this process's device where known without initialising CUDA), for rows of ``last_dim`` (narrow
    when not given); None if uncalibrated."""
    verdict = _verdict(op, dtype, bucket, device, dsl, last_dim)
    return None if verdict is None else verdict is not False


def faster_rivals(op: str, dtype: str, bucket: int, device: str | None = None, dsl: str = DEFAULT_DSL,
                  last_dim: int | None = None) -> tuple:
    """The DSLs calibrated faster than ``dsl`` (and faster than aten) for (op, dtype, bucket), fastest first."""
    verdict = _verdict(op, dtype, bucket, device, dsl, last_dim)
    return verdict if isinstance(verdict, tuple) else ()


def _verdict(op: str, dtype: str, bucket: int, device: str | None, dsl: str, last_dim: int | None = None) -> Any:
    if device is None:
        device = _running_device_key()
    if _suspended or device is None:
        return None
    verdicts = _ensure_loaded().get(device, {}).get((op, dtype), {}).get(dsl)
    return None if verdicts is None else verdicts[2 * min(max(bucket, 0), MAX_BUCKET) + width_class(last_dim)]


def never_wins(op: str, dsl: str = DEFAULT_DSL) -> bool:
    """True when ``dsl``'s ``op`` loses to aten in every calibrated row that applies to this machine.

    Used at registration, where the device is not known to torch without initialising CUDA. With
    ``PYTHON_NATIVE_CALIBRATION`` set (a user calibrating their own GPU), every table named must
    have rows for the op and none may win. With the packaged tables, the machine's GPU model is read
    through NVML (no CUDA context); where every GPU is one model and a table covers it, that table
    decides. Anything else (no NVML, mixed models, an uncalibrated model) keeps the op installed and
    leaves the choice to the per-call gate.
    """
    try:
        tables = _ensure_loaded()
    except (OSError, ValueError):
        return False
    if not tables:
        return False
    if env.calibration_path():
        return all(_loses_everywhere(per_key, op, dsl) for per_key in tables.values())
    if not any(_loses_everywhere(per_key, op, dsl) for per_key in tables.values()):
        return False  # no table would drop it: NVML need not be asked
    keys = nvml.device_keys()
    if keys is None or len(keys) != 1:
        return False
    per_key = tables.get(next(iter(keys)))
    return per_key is not None and _loses_everywhere(per_key, op, dsl)


def _loses_everywhere(per_key: dict[tuple[str, str], dict[str, Verdicts]], op: str, dsl: str) -> bool:
    """A table has rows of ``dsl`` for ``op`` and none of them wins, in any dtype or bucket."""
    rows = [per_dsl[dsl] for (o, _), per_dsl in per_key.items() if o == op and dsl in per_dsl]
    return bool(rows) and all(all(v is False for v in verdicts) for verdicts in rows)


_UNRESOLVED = object()
_gate_caches: list[dict] = []  # every gate's resolved verdicts, emptied by reset()
# op -> {dsl -> its own cond}: the gated overrides of each op, so a gate can ask whether a faster rival serves.
_gated_conds: dict[str, dict[str, Callable[..., bool]]] = {}


def _resolve(op: str, dsl: str, t: Any) -> Verdicts | None:
    """The per-bucket verdicts of ``dsl``'s ``op`` for ``t``'s device and dtype; None where uncalibrated."""
    try:
        tables = _ensure_loaded()
    except (OSError, ValueError):  # an unreadable table must not break the op: behave as uncalibrated
        return None
    return tables.get(device_key(t.device), {}).get((op, str(t.dtype).removeprefix("torch.")), {}).get(dsl)


def gated(op: str, cond: Callable[..., Any], dsl: str = DEFAULT_DSL) -> Callable[..., Any]:
    """``dsl``'s ``cond`` that also declines where the device's table says the override loses to aten,
    or where another DSL gated on the same op is calibrated faster there and would serve the call
    (it is switched on and installed here, and its own cond accepts).

    Per call, before the cond: two dict reads (dtype, then device index) that hold the op's
    verdicts for that dtype and device once resolved, and a tuple index by size bucket; the cond
    runs only where the table does not decline. Only where a faster rival exists: a set lookup of
    its DSL switch, and its cond. Where it accepts it returns the cond's own result, so a plan a
    cond hands to its impl (``impl_takes_plan``) passes through the gate.
    """
    import torch

    tensor_type = torch.Tensor
    dsl_off = REGISTRY.switches.dsl.off  # the live set the switches keep up to date
    unroutable = REGISTRY.unroutable_dsls
    rivals = _gated_conds.setdefault(op, {})
    rivals[dsl] = getattr(cond, "__wrapped__", cond)
    resolved: dict[Any, dict[int, Any]] = {}  # dtype -> device index (-1: CPU) -> verdicts
    _gate_caches.append(resolved)

    def calibrated_cond(*args: Any, **kwargs: Any) -> Any:
        # The table first: where the override loses (small, host-bound calls, mostly) the call then
        # declines without running the cond at all.
        t = args[0] if args and isinstance(args[0], tensor_type) else next(
            (a for a in args if isinstance(a, tensor_type)), None
        )
        if t is None or _suspended:
            return cond(*args, **kwargs)
        by_device = resolved.get(t.dtype)
        if by_device is None:
            by_device = resolved.setdefault(t.dtype, {})
        index = t.get_device()
        verdicts = by_device.get(index, _UNRESOLVED)
        if verdicts is _UNRESOLVED:
            verdicts = by_device[index] = _resolve(op, dsl, t)
        if verdicts is None:
            return cond(*args, **kwargs)
        verdict = verdicts[2 * min(t.numel().bit_length(), MAX_BUCKET) + width_class(t.shape[-1] if t.ndim else None)]
        if verdict is False:
            return False
        accepted = cond(*args, **kwargs)  # the cond's own result: a plan, where the impl takes one
        if not accepted:
            return False
        for rival in verdict:  # empty unless another DSL is calibrated faster for this bucket
            if rival in dsl_off or rival in unroutable:
                continue
            rival_cond = rivals.get(rival)
            if rival_cond is not None and rival_cond(*args, **kwargs):
                return False
        return accepted

    calibrated_cond.__name__ = f"calibrated_{getattr(cond, '__name__', 'cond')}"
    calibrated_cond.__wrapped__ = cond  # type: ignore[attr-defined]
    calibrated_cond.calibrated_dsl = dsl  # type: ignore[attr-defined]
    calibrated_cond.calibrated_op = op  # type: ignore[attr-defined]
    return calibrated_cond


def forget_gate(op: str, dsl: str) -> None:
    """Stop counting ``dsl`` as a rival on ``op`` (its override was removed)."""
    _gated_conds.get(op, {}).pop(dsl, None)


def gate_override(handle: OverrideHandle, cond: Callable[..., Any]) -> Callable[..., Any]:
    """The dispatch core's cond wrapper: ``cond`` gated where a table in force could apply to the
    override's key (see ``gates_needed``), ``cond`` itself elsewhere (it then costs nothing).

    Derived in-place/``out=`` variants are gated by their functional op's rows. A cond gated
    already (``gated`` called by hand) is left as it is.
    """
    if is_gated(cond) or not gates_needed(handle.dispatch_key):
        return cond
    return gated(handle.functional.op, cond, handle.dsl)


def is_gated(cond: Any) -> bool:
    """Whether ``cond`` is a calibration gate."""
    return hasattr(cond, "calibrated_dsl")


def _forget_removed(handle: OverrideHandle) -> None:
    """The core's removal listener: a removed override's gate is no rival any more."""
    if is_gated(handle.routed_cond):
        forget_gate(handle.routed_cond.calibrated_op, handle.routed_cond.calibrated_dsl)


extensions.wrap_conds(gate_override)
extensions.on_override_removed(_forget_removed)


def gated_dsls(op: str) -> list[str]:
    """The DSLs whose overrides of ``op`` carry a calibrated gate (for the status report)."""
    return sorted(_gated_conds.get(op, {}))


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Gates answer "uncalibrated" inside: calibration measures overrides the current table turns off."""
    global _suspended
    previous, _suspended = _suspended, True
    try:
        yield
    finally:
        _suspended = previous


def describe() -> dict[str, Any]:
    """Which tables are loaded and which one applies here, for the status report.

    ``{"source", "tables": [{"device", "path", "rows", "torch", "triton", "date"}], "device", "in_force"}``:
    ``device`` is this process's device key (None while CUDA is not initialised: it is not
    initialised for a report), ``in_force`` the path of the table for it (None: uncalibrated).
    """
    configured = env.calibration_path() or ""
    info: dict[str, Any] = {"source": f"{ENV_VAR}={configured}" if configured else "packaged", "tables": []}
    try:
        _ensure_loaded()
    except (OSError, ValueError) as e:
        info["error"] = str(e)
        return info
    info["tables"] = [{"device": device, **meta} for device, meta in sorted(_sources.items())]
    running = _running_device_key()
    info["device"] = running
    info["in_force"] = None if running is None else _sources.get(running, {}).get("path")
    return info


def _running_device_key() -> str | None:
    """This process's device key where knowing it costs nothing (no CUDA initialisation)."""
    if env.triton_interpret():
        return device_key("cpu")
    import torch

    if torch.cuda.is_initialized():
        return device_key(torch.device("cuda", torch.cuda.current_device()))
    return None
