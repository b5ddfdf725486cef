"""The portable policy: where an override may fire on a GPU that no calibration table covers.

Evidence: the shipped tables of GPUs, each with the ``device_properties`` it was measured on.
Per (DSL, op, dtype, width class) a table tells the smallest calibrated size bucket from which the
override won at every larger calibrated size (``tables.winning_from``), or that it never did.

The rule, for a GPU ``d`` (conservative: an override fires only where every table says it won):

- Host cost is what small calls lose on; a GPU that moves bytes faster, or has more SMs to fill,
  needs proportionally more elements to amortise it. Against each evidence table ``t``:
  ``shift = ceil(log2(max(1, bandwidth_d / bandwidth_t, sms_d / sms_t) / 1.02))`` buckets (2%
  tolerance for rounded figures). A slower GPU is never given a lower threshold than the one measured.
- ``from_d = max over t of (from_t + shift) + MARGIN_BUCKETS``; where any table that has rows for
  the cell says "never", never. A width class or dtype no table measured: declined (no evidence).
- An op with no cell left that fires is not installed.

A GPU NVML cannot describe is taken to be as fast as the fastest we know of (``ASSUMED``).
The verdicts have the tables' shape, so a gate costs exactly what a table's gate costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from python_native.features.calibration import tables
from python_native.features.calibration.sources import is_gpu_key

MARGIN_BUCKETS = 1
# What a GPU NVML cannot describe is assumed to have: a B200's SMs and HBM3e bandwidth.
ASSUMED = {"sm_count": 148, "memory_bandwidth_gbps": 8000.0}
SCALED_BY = ("memory_bandwidth_gbps", "sm_count")
TOLERANCE = 1.02  # a ratio within 2% of a power of two is that power (NVML's clocks against a datasheet's)
NEVER = None
_SPAN = 2 * (tables.MAX_BUCKET + 1)
DECLINE_ALL: tables.Verdicts = (False,) * _SPAN


@dataclass(frozen=True)
class Evidence:
    """One shipped GPU table as the policy reads it."""

    device: str
    path: str
    properties: dict[str, float]
    firsts: dict[tuple[str, str, str, int], int | None]  # (dsl, op, dtype, class) -> from bucket / never


def evidence(candidates: list[Any]) -> tuple[list[Evidence], list[str]]:
    """The usable evidence among shipped ``sources.Table``s, and a note per table left out (why)."""
    found, notes = [], []
    for table in candidates:
        if not is_gpu_key(table.device):
            continue
        props = table.header.get("device_properties") or {}
        missing = [k for k in SCALED_BY if k not in props]
        if missing:
            notes.append(f"{table.path}: no device_properties {missing}: not used as evidence")
            continue
        found.append(Evidence(table.device, table.path, dict(props), tables.winning_from(table.rows)))
    return found, notes


def shift(target: dict[str, float], reference: dict[str, float]) -> int:
    """Buckets to add to a threshold measured on ``reference`` for ``target`` (0 when not faster)."""
    ratio = max([1.0] + [target[k] / reference[k] for k in SCALED_BY if target.get(k) and reference.get(k)])
    return max(0, math.ceil(math.log2(ratio / TOLERANCE)))


class Policy:
    """The portable policy for one GPU: per (dsl, op), per dtype, the bucket each width class fires from."""

    def __init__(self, found: list[Evidence], device: str, properties: dict[str, float] | None):
        self.device = device
        self.assumed = [k for k in SCALED_BY if not (properties or {}).get(k)]
        self.properties = {**{k: ASSUMED[k] for k in self.assumed}, **(properties or {})}
        self.evidence = found
        self.shifts = {e.path: shift(self.properties, e.properties) for e in found}
        # (dsl, op) -> dtype -> [narrow, wide] from-buckets (None: never)
        self.cells: dict[tuple[str, str], dict[str, list[int | None]]] = {}
        combined: dict[tuple[str, str, str, int], list[int | None]] = {}
        for e in found:
            for (dsl, op, dtype, wide), first in e.firsts.items():
                scaled = NEVER if first is None else first + self.shifts[e.path]
                combined.setdefault((dsl, op, dtype, wide), []).append(scaled)
                self.cells.setdefault((dsl, op), {}).setdefault(dtype, [NEVER, NEVER])
        for (dsl, op, dtype, wide), firsts in combined.items():
            if NEVER not in firsts:
                self.cells[(dsl, op)][dtype][wide] = max(firsts) + MARGIN_BUCKETS  # type: ignore[type-var]
        self._verdicts: dict[tuple[str, str, str], tables.Verdicts] = {}

    def speaks_for(self, dsl: str, op: str) -> bool:
        """Whether the evidence has rows for ``dsl``'s ``op`` (other overrides are left to their conds)."""
        return (dsl, op) in self.cells

    def verdicts(self, dsl: str, op: str, dtype: str) -> tables.Verdicts | None:
        """Per (bucket, class) False where the policy declines, () where the override may fire;
        None for an op without evidence. A dtype without evidence declines everywhere."""
        per_dtype = self.cells.get((dsl, op))
        if per_dtype is None:
            return None
        hit = self._verdicts.get((dsl, op, dtype))
        if hit is None:
            froms = per_dtype.get(dtype)
            if froms is None:
                hit = DECLINE_ALL
            else:
                hit = tuple(() if froms[w] is not None and b >= froms[w] else False
                            for b in range(tables.MAX_BUCKET + 1) for w in (0, 1))
            self._verdicts[(dsl, op, dtype)] = hit
        return hit

    def never_wins(self, dsl: str, op: str) -> bool:
        """The evidence has rows for the op, and no (dtype, class) of it fires on this GPU."""
        per_dtype = self.cells.get((dsl, op))
        return per_dtype is not None and all(f is None or f > tables.MAX_BUCKET
                                             for froms in per_dtype.values() for f in froms)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "portable",
            "device": self.device,
            "properties": self.properties,
            "assumed": self.assumed,
            "margin_buckets": MARGIN_BUCKETS,
            "evidence": [{"device": e.device, "path": e.path, "properties": e.properties,
                          "shift_buckets": self.shifts[e.path]} for e in self.evidence],
        }
