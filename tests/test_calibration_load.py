"""A calibration table loads in time linear in its rows: its work counted, and one cost ratio.

A valid table of 160,000 rows once took 23 s to its first gated call: each row copied the list of
speedups of its (bucket, width class) cell, so a cell of k rows cost k^2. On tables of N, 2N and
4N rows (all in one cell, the worst case, or spread), every Python and C call made from listing
the tables to the first gated call's answer is counted (``sys.setprofile``): the calls a row
costs must not grow with the rows. C work (a list copied, a sort) makes no call per element, so a
ratio of CPU times on generous margins, not a time limit, backs the count: 8x the rows in one cell
must cost well under 64x. ``benchmarks/calibration_load.py`` times the load at scale.
"""

from __future__ import annotations

import collections
import gc
import json
import re
import sys
import time

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from calibration_testing import FAKE_DEVICE, table

from python_native.features import calibration
from python_native.features.calibration import tables, usable_rows

N = 1500


def _rows(count: int, spread: bool) -> list[dict]:
    """``count`` valid rows with every field ``bench --calibrate`` writes: in one cell (``_softmax``
    float32, bucket 14, narrow rows), or spread over ops, dtypes, buckets and width classes."""
    rows = []
    for i in range(count):
        op, dtype, bucket, cols = "_softmax", "float32", 14, 1024
        if spread:
            op, dtype = ("_softmax", "silu")[i % 2], ("float32", "bfloat16")[i // 2 % 2]
            bucket, cols = 12 + 2 * (i // 4 % 8), (1024, 8192)[i // 32 % 2]
        speedup = 0.5 + i * 7919 % 1000 / 1000
        rows.append({"dsl": "triton", "op": op, "dtype": dtype, "bucket": bucket, "shape": [(1 << bucket - 1) // cols, cols],
                     "last_dim": cols, "override_ms": 0.01, "aten_ms": round(0.01 * speedup, 5),
                     "speedup": round(speedup, 4), "wins": speedup >= 1.05})
    return rows


def _first_gated_call(calib, rows: list[dict]):
    """The user's table holds ``rows``; returns the first gated call (tables listed, read, validated,
    their rows sorted, the verdicts of the call's op and dtype) to run."""
    calib.user(table(rows=rows))
    calib.device(FAKE_DEVICE)
    gate = calibration.gated("_softmax", lambda x, dim, half_to_float: True)
    x = torch.randn(2, 1024)

    def call():
        assert gate(x, -1, False) in (True, False)
        assert calibration.resolve.resolution(FAKE_DEVICE).tables  # the table is in force

    return call


def _calls(call) -> int:
    """Every Python and C function call ``call`` makes (the garbage collector held off: no callbacks)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" or event == "c_call":
            count += 1

    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        gc.enable()
    return count


@pytest.mark.parametrize("spread", [False, True], ids=["one cell", "spread"])
def test_the_calls_to_load_a_table_grow_linearly_with_its_rows(calib, spread):
    _calls(_first_gated_call(calib, _rows(10, spread)))  # once: what a process computes once is done
    counts = [_calls(_first_gated_call(calib, _rows(n * N, spread))) for n in (1, 2, 4)]
    first, second = counts[1] - counts[0], counts[2] - counts[1]  # N more rows, then 2N more
    assert first > 0 and second <= 2.2 * first, counts  # quadratic: 4x; linear: 2x
    assert first / N < 60, counts  # a constant few calls a row


def _cpu_seconds(text: str) -> float:
    """CPU time to load a table's ``text``: read, validated, its rows sorted, the verdicts of its
    first (op, dtype) (the garbage collector held off: its passes cost what the heap holds)."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        raw = tables.parse(text, "t")
        rows = usable_rows.UsableRows({k: v for k, v in raw.items() if k != "rows"}, raw["rows"])
        assert rows.verdicts("_softmax", "float32", "triton") is not None
        return time.process_time() - start
    finally:
        gc.enable()


def test_a_table_of_8x_the_rows_in_one_cell_costs_about_8x_not_64x():
    """A cost ratio on generous margins, not a time limit: a step that copies what a cell gathered
    for each row it adds (C work no call count sees) makes 8x the rows cost far more than 8x. The
    best of three pairs, each loaded in turn, so that a busy machine slows both of a pair."""
    small, large = (json.dumps(table(rows=_rows(n, spread=False)), indent=1) for n in (4000, 32000))
    _cpu_seconds(small)  # warm: what a process computes once
    ratios = [_cpu_seconds(large) / _cpu_seconds(small) for _ in range(3)]
    assert min(ratios) < 16, ratios  # linear: 8 (less, with what does not grow); the quadratic step: about 50


BAD_ROWS = {
    "blank op": ({"op": " ", "dtype": "float32", "bucket": 9, "wins": True}, "'op' must be a non-empty string"),
    "blank dtype": ({"op": "silu", "dtype": "", "bucket": 9, "wins": True}, "'dtype' must be a non-empty string"),
    "no wins": ({"op": "silu", "dtype": "float32", "bucket": 9}, "lacks ['wins']"),
    "bucket out of range": ({"op": "silu", "dtype": "float32", "bucket": 65, "wins": True}, "bucket 65 (a number)"),
    "wins as a number": ({"op": "silu", "dtype": "float32", "bucket": 9, "wins": 1}, "'wins' must be true or false"),
    "blank dsl": ({"dsl": " ", "op": "silu", "dtype": "float32", "bucket": 9, "wins": True}, "'dsl' must be"),
    "null dsl": ({"dsl": None, "op": "silu", "dtype": "float32", "bucket": 9, "wins": True}, "'dsl' must be"),
    "blank kernel": ({"kernel": "", "op": "silu", "dtype": "float32", "bucket": 9, "wins": True}, "'kernel' must be"),
    "negative last_dim": ({"op": "silu", "dtype": "float32", "bucket": 9, "wins": True, "last_dim": -1}, "'last_dim'"),
    "boolean in shape": ({"op": "silu", "dtype": "float32", "bucket": 9, "wins": True, "shape": [True]}, "'shape'"),
    "infinite speedup": ({"op": "silu", "dtype": "float32", "bucket": 9, "wins": True, "speedup": float("inf")},
                         "'speedup' must be a number or null"),
    "first_use as a string": ({"op": "silu", "dtype": "float32", "bucket": 9, "wins": True, "first_use": "yes"},
                              "'first_use' must be true or false"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_bad_row_is_refused_by_its_index_wherever_it_sits(case):
    """The fast check of the common rows lets no bad row through: at the start, after plain rows of
    both kinds, and after a valid row it leaves to the field-by-field check (not a plain dict)."""
    bad, message = BAD_ROWS[case]
    good = [*_rows(40, spread=True), {"op": "silu", "dtype": "float32", "bucket": 3, "wins": False}]
    for before in ([], good, [*good, collections.OrderedDict(good[-1]), *good]):
        content = table(rows=[*before, bad, *good])
        where = rf"t: row {len(before)}\b.*{re.escape(message)}"
        with pytest.raises(ValueError, match=where):
            tables.validate(content, "t")
        with pytest.raises(ValueError, match=where):
            tables.parse(json.dumps(content), "t")  # as read from a file (Infinity included)
