"""Calibration: where, on a given GPU, an override measured slower than aten, and a gate that declines there.

``python -m python_native bench --calibrate`` times every override against aten per (op, dtype,
size bucket, row width) on the running device and writes a table into the user's cache dir, in
force for every later process on that machine. Tables also ship with the package
(``python_native/features/calibration/shipped_tables/``), and ``PYTHON_NATIVE_CALIBRATION`` names a table file or a
folder of them to use instead (``off``: no gate at all; ``portable``: the portable policy alone).
A GPU no table covers is gated by the portable policy, derived from the shipped tables and scaled
by what the GPU has (``portable``).

``pn.benchmark`` (``first_use``; ``PYTHON_NATIVE_BENCHMARK`` seeds it) measures, on a GPU, each
(op, dtype, size bucket, width class) no table measured, on the first call that meets it, and
keeps the verdict in the user's table. A table records the kernel version of each op it timed
(``versions``): rows of other kernels count as unmeasured.

Modules: ``tables`` (the format, validation, verdicts), ``sources`` (where tables come from,
precedence, version drift), ``usable_rows`` (what a table's rows are worth now), ``versions`` (kernel
source versions), ``store`` (the user's tables: atomic writes, deletion), ``portable`` (the
policy), ``resolve`` (what gates each device), ``gates`` (the gate around a cond), ``first_use``
and ``measure`` (``pn.benchmark``), ``summary`` (what the status report shows).

Nothing is read at import: files are listed and parsed on first use, and the device key of a CUDA
tensor is asked of torch the first time a gated cond sees that device index (CUDA is initialised
by then, since the tensor lives there). Registration reads NVML (no CUDA context) to know which
GPU models the CUDA key serves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from python_native.core import extensions
from python_native.features.calibration import (
    first_use,
    gates,
    portable,
    resolve,
    sources,
    tables,
    usable_rows,
    versions,
)
from python_native.features.calibration.gates import (
    Gate,
    forget_gate,
    gate_of,
    gate_override,
    gated,
    gated_dsls,
    gates_needed,
    has_evidence,
    is_gated,
    leave_out,
    left_out,
    never_wins,
    suspended,
)
from python_native.features.calibration.resolve import device_key
from python_native.features.calibration.sources import ENV_VAR, OFF, PACKAGED_DIR, PORTABLE, CalibrationDriftWarning
from python_native.features.calibration.tables import (
    DEFAULT_DSL,
    FORMAT,
    MAX_BUCKET,
    WIDE_ROW,
    Verdicts,
    cell_of,
    confirm_wins,
    load,
    size_bucket,
    table_filename,
    validate,
    width_class,
)

_verdicts = tables.verdicts  # the verdicts of a list of rows (tests build them by hand)

# Loaded on first access: what registration never needs (``pn.benchmark``'s measuring, the user's
# table store, the status summary). Name -> the module that has it (None: the module itself).
_LAZY = {"measure": None, "store": None, "summary": None, "describe": "summary"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f"{__name__}.{_LAZY[name] or name}")
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value

__all__ = [
    "DEFAULT_DSL", "ENV_VAR", "FORMAT", "MAX_BUCKET", "OFF", "PACKAGED_DIR", "PORTABLE", "WIDE_ROW",
    "CalibrationDriftWarning", "Gate", "Verdicts", "benchmark", "benchmark_set", "cell_of", "confirm_wins", "declare_kernels",
    "describe", "device_key", "faster_rivals", "forget_gate", "gate_of", "gate_override", "gated", "gated_dsls",
    "gates_needed", "has_evidence", "is_gated", "leave_out", "left_out", "load", "measure_on_first_use", "never_wins",
    "reset",
    "save_table", "set_benchmark", "set_device_key_fn", "size_bucket", "suspended", "table_filename", "validate",
    "width_class", "wins",
    "first_use", "gates", "measure", "portable", "resolve", "sources", "store", "summary", "tables",
    "usable_rows", "versions",  # the modules
]


def reset() -> None:
    """Forget loaded tables and device keys (after changing ``PYTHON_NATIVE_CALIBRATION``, writing a
    table, tests); every router is then re-selected so a compiled front re-reads the gates."""
    gates.reset()


def set_device_key_fn(fn: Callable[[Any], str] | None) -> None:
    """Replace how a tensor's device key is computed (tests inject fake devices); None restores."""
    resolve.set_device_key_fn(fn)
    reset()


def save_table(table: dict[str, Any], path: Any = None) -> Any:
    """Write a calibration table (into the user's cache dir unless ``path``) and put it in force here."""
    from python_native.features.calibration import store

    written = store.save(table, path)
    reset()
    return written


def benchmark() -> bool | str:
    """``pn.benchmark``: False, True (measure on first use every size no table measured) or
    ``"unmeasured"`` (only where no table speaks); see ``first_use``."""
    return first_use.mode()


def set_benchmark(value: Any) -> None:
    """Set ``pn.benchmark`` (a bad value raises ``ValueError`` naming the allowed ones); the gates
    read their verdicts again, and a compiled front its masks. Switched on, it gates the installed
    overrides no source spoke for (switched off, those gates go again); op families left out at
    import as unmeasured need ``PYTHON_NATIVE_BENCHMARK`` set before it (they install at import only)."""
    if first_use.set_mode(value):
        gates.reread()
        gates.regate()  # overrides nothing else speaks for are gated while it measures, and only then


def measure_on_first_use(ops: Any, device: Any) -> bool:
    """``pn.patch``'s request for a model on ``device``: on a GPU, each of ``ops`` is measured on its
    first call per (dtype, size bucket) as under ``pn.benchmark = True``, unless the user set
    ``pn.benchmark = False``; the gates read their verdicts again. True where they are measured."""
    if not sources.is_gpu_key(resolve.device_key(device)):
        return False
    if first_use.request(ops):
        gates.reread()
        gates.regate()  # the overrides of ``ops`` no source spoke for are gated now
    return all(first_use.requested(op) for op in ops)


class benchmark_set:  # noqa: N801  (used like a function: ``with pn.benchmark_set(True):``)
    """Context manager: ``pn.benchmark`` is ``value`` inside the block, the previous value after."""

    def __init__(self, value: Any) -> None:
        first_use.check(value)
        self.value, self._previous = value, []

    def __enter__(self) -> None:
        self._previous.append((first_use.mode(), first_use.refused()))
        set_benchmark(self.value)

    def __exit__(self, *exc: object) -> None:
        value, refused = self._previous.pop()
        set_benchmark(value)
        first_use.set_refused(refused)  # restoring False is not the user refusing ``pn.patch``'s measuring


def declare_kernels(dsl: str, ops: Any) -> None:
    """A backend's ``(op, impl)`` pairs: each op's kernel version is read from its impl's sources
    (``versions``), so that tables timed with other kernels count as unmeasured for it."""
    versions.declare(dsl, ops)


def _verdict(op: str, dtype: str, bucket: int, device: str | None, dsl: str, last_dim: int | None) -> Any:
    if device is None:
        device = resolve.running_device_key()
    if gates._suspended or device is None:
        return None
    found = resolve.resolution(device).verdicts(dsl, op, dtype, measuring=False)
    return None if found is None else found[2 * min(max(bucket, 0), MAX_BUCKET) + width_class(last_dim)]


def wins(op: str, dtype: str, bucket: int, device: str | None = None, dsl: str = DEFAULT_DSL,
         last_dim: int | None = None) -> bool | None:
    """Whether ``dsl``'s override beats aten for (op, dtype, bucket) on ``device`` (a device key; default:
    this process's device where known without initialising CUDA), for rows of ``last_dim`` (narrow
    when not given), by the source in force there (a table, else the portable policy on a GPU);
    None where nothing speaks for it."""
    verdict = _verdict(op, dtype, bucket, device, dsl, last_dim)
    return None if verdict is None else verdict is not False


def faster_rivals(op: str, dtype: str, bucket: int, device: str | None = None, dsl: str = DEFAULT_DSL,
                  last_dim: int | None = None) -> tuple:
    """The DSLs calibrated faster than ``dsl`` (and faster than aten) for (op, dtype, bucket), fastest first."""
    verdict = _verdict(op, dtype, bucket, device, dsl, last_dim)
    return verdict if isinstance(verdict, tuple) else ()


def _masks_of(cond: Any) -> Callable[[str], dict[str, tuple[int, int]] | None] | None:
    """For a compiled front: a gate's decline masks for the calls a dispatch key serves."""
    found = gate_of(cond)
    if found is None:
        return None

    def at(dispatch_key: str) -> dict[str, tuple[int, int]] | None:
        device = resolve.device_at(dispatch_key)
        return found.decline_masks(device) if device is not None else None

    return at


def _unwrap(cond: Any) -> Any:
    """The cond a calibration gate wraps (None: ``cond`` is no gate)."""
    found = gate_of(cond)
    return found.__wrapped__ if found is not None else None


def _status() -> dict[str, Any]:
    """``pn.status()["calibration"]``: this package's ``describe``, whose module (``summary``) is
    loaded only when a report asks."""
    return sys.modules[__name__].describe()


extensions.register(extensions.Hooks(
    "calibration gate", wrap_cond=gate_override, unwrap=_unwrap, override_removed=gates.forget_removed,
    call_gates=extensions.CallGates(WIDE_ROW, _masks_of), status=_status, status_key="calibration"))
