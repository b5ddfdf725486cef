"""``pn.benchmark``: what this process measures on first use, and what it has learned.

Like ``torch.backends.cudnn.benchmark``: off by default; ``True`` measures, on a GPU, every (op,
dtype, size bucket, width class) that no table in force measured with the running kernels, the
first time a call of it reaches an override's gate; ``"unmeasured"`` only those no table speaks
for at all (the portable policy or nothing decides there, or the table's rows are stale).
``PYTHON_NATIVE_BENCHMARK`` seeds it (``1``, ``unmeasured``). The measuring itself is
``measure.decide``; the cells a verdict tuple marks ``MEASURE`` are built by ``resolve``.

State here, behind one lock: the verdicts learned in this process (also written to the user's
table, so the next process starts with them), and the cells being measured right now (one
thread measures a cell; the others do not wait: their calls go by the verdict that stood before).
"""

from __future__ import annotations

import threading
from typing import Any

from python_native.features.calibration import sources
from python_native.foundations import env

UNMEASURED = env.BENCHMARK_UNMEASURED
ENV_VAR = env.BENCHMARK[0]


class _Measure:
    """The mark of a cell to measure on first use (it sits in a verdict where the faster rivals go)."""

    def __repr__(self) -> str:
        return "MEASURE"


MARK = _Measure()
MEASURE: tuple = (MARK,)  # a cell's verdict: measure on first use

_lock = threading.Lock()
_mode: bool | str | None = None  # None: not read from the environment yet
# (device key, dsl, op, dtype) -> {cell: won}: verdicts measured or adopted by this process
_learned: dict[tuple[str, str, str, str], dict[int, bool]] = {}
_claimed: set[tuple[str, str, str, str, int]] = set()  # cells a thread is measuring now
_requested: set[str] = set()  # ops ``pn.patch`` routes a GPU model to: measured as under ``True``
_refused = False  # the user set ``pn.benchmark = False``: nothing is measured, asked for or not
generation = 0  # bumped whenever a verdict is learned or the mode changes: resolutions rebuild


def mode() -> bool | str:
    """``pn.benchmark`` now: False, True or ``"unmeasured"`` (seeded from ``PYTHON_NATIVE_BENCHMARK``)."""
    found = _mode
    if found is None:
        found = _from_env()
    return found


def _from_env() -> bool | str:
    global _mode
    _mode = env.benchmark_mode()
    return _mode


def check(value: Any) -> bool | str:
    """``value`` if ``pn.benchmark`` can take it; else ``ValueError`` naming it and what is allowed."""
    if value is True or value is False or (isinstance(value, str) and value == UNMEASURED):
        return value
    raise ValueError(f"pn.benchmark must be False, True or {UNMEASURED!r}, got {value!r}")


def set_mode(value: Any) -> bool:
    """Set ``pn.benchmark``; True when it changed (the caller re-reads the gates then)."""
    global _mode, generation, _refused
    check(value)
    with _lock:
        changed = mode() != value
        _mode = value
        _refused = value is False
        generation += 1
    return changed


def refused() -> bool:
    return _refused


def set_refused(value: bool) -> None:
    global _refused, generation
    with _lock:
        _refused = value
        generation += 1


def request(ops: Any) -> bool:
    """Measure ``ops`` on first use, as ``pn.benchmark = True`` would, whatever ``pn.benchmark`` says,
    unless the user set it to False; True when that added an op (the caller re-reads the gates)."""
    global generation
    with _lock:
        new = set(ops) - _requested
        if _refused or not new:
            return False
        _requested.update(new)
        generation += 1
    return True


def requested(op: str | None) -> bool:
    """Whether ``op`` is measured on first use because ``pn.patch`` asked (and the user did not refuse)."""
    return op is not None and not _refused and op in _requested


def active_for(device_key: str, catalog_mode: str, op: str | None = None) -> bool:
    """Whether calls (of ``op``, where given) on ``device_key`` are measured on first use:
    ``pn.benchmark`` is on (or ``pn.patch`` asked for ``op``), the device is a GPU, and calibration
    is neither off nor forced to the portable policy alone."""
    return (bool(mode()) or requested(op)) and catalog_mode == "tables" and sources.is_gpu_key(device_key)


def learned(device: str, dsl: str, op: str, dtype: str) -> dict[int, bool]:
    """The cells of (dsl, op, dtype) this process measured or adopted on ``device``: cell -> won."""
    return _learned.get((device, dsl, op, dtype), {})


def learned_ops(device: str) -> set[tuple[str, str]]:
    return {(dsl, op) for (d, dsl, op, _) in _learned if d == device}


def learned_dtypes(device: str, dsl: str, op: str) -> set[str]:
    return {dtype for (d, s, o, dtype) in _learned if (d, s, o) == (device, dsl, op)}


TAKEN = "taken"  # claim()'s answer to the thread that is to measure


def claim(key: tuple[str, str, str, str, int]) -> bool | str | None:
    """Take ``key`` (device, dsl, op, dtype, cell) to measure: ``TAKEN`` when this thread measures
    it; its verdict where it was learned already; None while another thread measures it."""
    with _lock:
        known = _learned.get(key[:4], {}).get(key[4])
        if known is not None:
            return known
        if key in _claimed:
            return None
        _claimed.add(key)
        return TAKEN


def learn(key: tuple[str, str, str, str, int], won: bool | None) -> None:
    """Record the verdict of a claimed cell (None: none reached, the claim is dropped) and release it."""
    global generation
    with _lock:
        _claimed.discard(key)
        if won is not None:
            _learned.setdefault(key[:4], {})[key[4]] = won
            generation += 1


def forget() -> None:
    """Drop what this process learned (``calibration.reset()``: the tables are read again)."""
    global generation
    with _lock:
        _learned.clear()
        generation += 1
