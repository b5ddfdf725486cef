"""Loading a big calibration table: seconds to the first gated call's answer, per table size (CPU).

Run anywhere: ``PYTHONPATH=. python benchmarks/calibration_load.py [--sizes 10000,100000,600000]
[--rows required|bench] [--cells 48] [--repeat 3] [--json]``.

Per size, a valid table is generated and written as ``bench --calibrate`` writes one (``store.save``:
indented JSON in the user's calibration folder, here a private temporary folder named by
``XDG_CACHE_HOME``), for a fake GPU the tensors of this process report as their device. Its rows
fill a fixed set of cells (3 ops x 2 dtypes x 8 size buckets; ``--cells 1``: all in one), so the
rows per cell grow with the table: a step that is quadratic in a cell's rows shows at once. ``--rows required`` writes rows of
the four required fields (``op``, ``dtype``, ``bucket``, ``wins``: the densest valid rows, so that
600,000 of them fit under the 64 MiB cap); ``--rows bench`` every field ``bench --calibrate``
writes (about 230 bytes a row: sizes whose file would pass the cap are skipped).

Timed, the median of ``--repeat`` runs, each after ``calibration.reset()``: ``load`` (reading and
validating the file: ``tables.load``) and ``first call`` (a gated ``_softmax`` call's first
answer: listing the sources, the trust checks, loading and validating the table, the rows that
count and the verdicts of the call's op and dtype, the portable policy's evidence). Both are
printed in seconds and in microseconds per row: flat per-row figures across sizes mean linear. The
first call's CPU time is printed too: on a machine other processes share, it is near what the
wall time would be on an idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEVICE = "Calibration Load Benchmark GPU/sm90"
OPS = ("_softmax", "silu", "native_layer_norm")
DTYPES = ("float32", "bfloat16")
BUCKETS = tuple(range(12, 28, 2))


CELLS = [(op, dtype, bucket) for bucket in BUCKETS for dtype in DTYPES for op in OPS]  # _softmax float32 first


def make_rows(count: int, fields: str, cells: int = len(CELLS)) -> list[dict]:
    """``count`` valid rows over the first ``cells`` (op, dtype, bucket) cells; ``fields``:
    ``required`` or ``bench``."""
    rows = []
    for i in range(count):
        op, dtype, bucket = CELLS[i % cells]
        speedup = round(0.5 + (i * 7919 % 1000) / 1000, 4)
        row = {"op": op, "dtype": dtype, "bucket": bucket, "wins": speedup >= 1.05}
        if fields == "bench":
            cols = 8192 if i // cells % 2 else 1024
            row = {"dsl": "triton", **row, "shape": [max(1, (1 << (bucket - 1)) // cols), cols], "last_dim": cols,
                   "override_ms": 0.01, "aten_ms": round(0.01 * speedup, 5), "speedup": speedup}
        rows.append(row)
    return rows


def make_table(count: int, fields: str, cells: int = len(CELLS)) -> dict:
    """A table as ``bench --calibrate`` writes it: the running versions, the kernels timed, the rows."""
    import torch

    from python_native.features import calibration
    from python_native.foundations import dsl_registry

    triton = str(dsl_registry.version("triton") or "3.9.0")
    table = {"format": calibration.FORMAT, "device": DEVICE, "torch": torch.__version__, "triton": triton,
             "dsls": {"triton": triton}, "date": "2026-01-01T00:00:00Z",
             "bucket": "bit_length(numel of the op's first tensor argument)", "threshold": 1.05,
             "rows": make_rows(count, fields, cells)}
    kernels = calibration.versions.table_entry({("triton", op) for op in OPS})
    if kernels:
        table["kernels"] = kernels
    return table


def measure(count: int, fields: str, repeat: int, cells: int = len(CELLS)) -> dict | None:
    """Write a table of ``count`` rows into the user's folder and time loading it; None over the cap."""
    import torch

    from python_native.features import calibration
    from python_native.features.calibration import store, tables

    store.delete_user_tables()
    path = store.save(make_table(count, fields, cells))
    size = path.stat().st_size
    if size > tables.MAX_FILE_BYTES:
        path.unlink()
        return None
    calibration.set_device_key_fn(lambda device: DEVICE)
    gate = calibration.gated("_softmax", lambda x, dim, half_to_float: True)
    x = torch.randn(4, 1024)
    loads, firsts, cpus = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        tables.load(path)
        loads.append(time.perf_counter() - start)
        calibration.reset()
        start, cpu = time.perf_counter(), time.process_time()
        answer = gate(x, -1, False)
        firsts.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        assert answer in (True, False)
        assert calibration.resolve.resolution(DEVICE).tables, "the table was not in force"
    calibration.set_device_key_fn(None)
    load, first = statistics.median(loads), statistics.median(firsts)
    return {"rows": count, "fields": fields, "mib": round(size / (1 << 20), 1), "load_s": round(load, 3),
            "first_call_s": round(first, 3), "first_call_cpu_s": round(statistics.median(cpus), 3),
            "load_us_per_row": round(load / count * 1e6, 2),
            "first_call_us_per_row": round(first / count * 1e6, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,600000", help="row counts, comma-separated")
    parser.add_argument("--rows", choices=("required", "bench"), default="required", help="the fields of each row")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (the median is shown)")
    parser.add_argument("--cells", type=int, choices=range(1, len(CELLS) + 1), default=len(CELLS), metavar="1..48",
                        help="the (op, dtype, bucket) cells the rows fill (1: every row in one, the worst case)")
    parser.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="calibration-load-") as private:
        os.environ["XDG_CACHE_HOME"] = private  # the user's calibration folder, only ours
        os.environ["PYTHON_NATIVE_BACKGROUND_BUILD"] = "0"  # no compiled front built into it meanwhile
        os.environ.pop("PYTHON_NATIVE_CALIBRATION", None)
        import python_native  # noqa: F401  (registers the backends)

        if not args.json:
            print(f"{'rows':>9} {'MiB':>6} {'load s':>8} {'us/row':>7} {'first call s':>13} {'us/row':>7} {'(CPU s)':>8}")
        for count in (int(s) for s in args.sizes.split(",")):
            found = measure(count, args.rows, args.repeat, args.cells)
            if found is None:
                print(f"{count:>9} rows of {args.rows} fields: over the 64 MiB cap, skipped")
            elif args.json:
                print(json.dumps(found))
            else:
                print(f"{count:>9} {found['mib']:>6} {found['load_s']:>8} {found['load_us_per_row']:>7} "
                      f"{found['first_call_s']:>13} {found['first_call_us_per_row']:>7} {found['first_call_cpu_s']:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
