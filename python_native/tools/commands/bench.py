"""``python -m python_native bench``: overrides against aten (and Inductor, Liger, QuACK) on this machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from python_native.tools.commands.names import for_rows, listed
from python_native.tools.commands.usage import UsageError, report, writable_file

HELP = "benchmark the overrides against aten on this device, or write a calibration table (--calibrate)"


class _RowsHelp(str):
    """A help text whose ``{rows}`` is the benchmark's rows (the ops' declarations among them), read
    only when the help is printed (argparse formats it with ``%``): building the parser stays cheap."""

    def __mod__(self, params: object) -> str:
        from python_native.tools.bench import OPS

        return str.__mod__(self.replace("{rows}", ", ".join(OPS)), params)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No import of python_native.tools.bench here: building the CLI parser must stay cheap for the status report.
    parser.add_argument("--quick", action="store_true", help="tiny shapes (what the Triton interpreter can run)")
    parser.add_argument("--dtype", "--dtypes", dest="dtypes", action="append", metavar="D",
                        help="only this dtype (repeatable, or a comma list): float32, float16, bfloat16 (default: all)")
    parser.add_argument("--op", "--ops", dest="ops", action="append", metavar="NAME",
                        help=_RowsHelp("only this op (repeatable, or a comma list): a row, {rows}; or any op name "
                                       "the panel takes (_softmax, bmm, ...), selecting the rows that reach it"))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--save-json", metavar="FILE", default=None,
                        help="also write the rows and the environment as JSON to FILE (the table still prints)")
    parser.add_argument("--plot", metavar="PNG", default=None, help="write speedup-vs-shape plots (needs matplotlib)")
    parser.add_argument("--variants", action="store_true",
                        help="also time every variant the fired overrides declare (a cell per variant, in ms)")
    parser.add_argument("--no-inductor", action="store_true", help="skip the torch.compile column (default on GPU)")
    parser.add_argument("--calibrate", action="store_true",
                        help="time each overridden aten op against aten per dtype and size bucket; write a table")
    parser.add_argument("--output", default=None,
                        help="where --calibrate writes its table (default: the user's cache dir, "
                             "in force for every later process on this machine)")
    parser.add_argument("--threshold", type=float, default=1.05,
                        help="--calibrate: minimum aten/override time ratio for the override to stay on "
                             "(default %(default)s: a win must clear the timer's noise)")
    parser.add_argument("--allow-interpreter", action="store_true",
                        help="--calibrate without a GPU, through Triton's interpreter (for testing only)")
    parser.add_argument("--prove-replay", action="store_true",
                        help="compare replayed calls with Python-served ones on this GPU; where all agree, write "
                             "the proof that turns replay on by default for this GPU and these torch/Triton versions")


def _check(args: argparse.Namespace) -> tuple[list, list[str] | None]:
    """The dtypes and benchmark rows asked for, every path and value checked before any work."""
    from python_native.tools import bench

    try:
        dtypes = bench.parse_dtypes(",".join(listed(args.dtypes)) or "float32,float16,bfloat16")
    except ValueError as e:
        raise UsageError(str(e)) from None
    ops = for_rows("--op", bench.OPS).resolve(args.ops)
    if args.save_json:
        args.save_json = str(writable_file("--save-json", args.save_json))
    if args.plot:
        args.plot = str(writable_file("--plot", args.plot, _plot_types()))
    if args.calibrate:
        if not args.threshold > 0:
            raise UsageError(f"--threshold {args.threshold}: must be a positive aten/override time ratio (e.g. 1.0)")
        writable_file("--output", args.output)
    return dtypes, ops


def _plot_types() -> tuple[str, ...]:
    """The file types matplotlib can write; ``UsageError`` when it is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    return tuple(Figure().canvas.get_supported_filetypes())


def run(args: argparse.Namespace) -> int:
    from python_native.tools import bench

    if args.prove_replay:
        return _prove_replay(args)

    dtypes, ops = _check(args)
    try:
        device = bench.pick_device(args.quick or args.calibrate)
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    if device == "cpu":
        import torch

        torch.set_num_threads(1)  # tiny interpreter shapes: a thread pool only adds contention noise
    if args.calibrate:
        return _calibrate(args, device, dtypes, ops)
    env = bench.environment(device)
    bandwidth = None
    if device == "cuda":
        bandwidth = bench.copy_bandwidth(device, bench.gpu_timer())
        env["copy_bandwidth_gbps"] = round(bandwidth / 1e9, 1)
    if not args.json:
        bw = f"; copy bandwidth {env['copy_bandwidth_gbps']} GB/s" if bandwidth else ""
        print(f"device {env['device_name']}; torch {env['torch']}; triton {env['triton']}{bw}")
        print(bench.HEADER)
    cases = bench.cases(dtypes, args.quick, ops)
    inductor = device == "cuda" and not args.no_inductor
    done: list = []

    def progress(row: bench.Row) -> None:
        done.append(row)
        if not args.json:
            print(bench.format_row(row), flush=True)
        if args.save_json:  # rewritten per row: a run cut short still leaves its rows
            _write_json(args.save_json, env, done)

    rows = bench.run_rows(cases, device, inductor, progress, bandwidth, args.variants)
    if args.json:
        print(bench.json_document(env, rows))
    else:
        print(bench.geometric_mean_line(rows))
    if args.plot:
        unfired = bench.plot(rows, args.plot)
        note = f"; {unfired} rows where no override fired drawn hollow, in grey ('aten ran')" if unfired else ""
        print(f"plot written to {args.plot}{note}", file=sys.stderr)
    if rows and not any(r.fired for r in rows):  # after the rows: on stderr, whatever the format
        report("bench", "no override fired in any row: nothing was measured but aten (are the overrides "
               "installed and switched on? see python -m python_native status)", args.json, sys.stderr)
        return 2
    return 0


def _prove_replay(args: argparse.Namespace) -> int:
    import json

    from python_native.features import calibration
    from python_native.features.front import proof
    from python_native.tools.bench import replay_proof

    results, problem = replay_proof.prove()
    if problem:
        raise UsageError(problem)
    ran = [r for r in results if r["passed"] is not None]
    passed = bool(ran) and all(r["passed"] for r in ran)
    device = calibration.device_key("cuda")
    path = proof.write(device, results, passed) if passed else None
    if args.json:
        print(json.dumps({"device": device, "passed": passed, "proof": str(path) if path else None, "cases": results},
                         indent=1))
    else:
        for r in results:
            verdict = "skipped" if r["passed"] is None else "ok" if r["passed"] else "FAILED"
            print(f"{r['case']:<44} {verdict:<8} {r['problem']}")
        print(f"replay proven on {device}; proof written to {path}" if passed else
              "replay NOT proven: it stays off by default here (see the failures above)")
    return 0 if passed else 1


def _write_json(path: str, env: dict, rows: list) -> None:
    from python_native.foundations import safe_write
    from python_native.tools import bench

    safe_write.write(Path(path), bench.json_document(env, rows) + "\n")


def _calibrate(args: argparse.Namespace, device: str, dtypes: list, ops: list[str] | None) -> int:
    from python_native.features import calibration
    from python_native.tools import bench
    from python_native.tools.bench.progress import Progress

    if device != "cuda" and not args.allow_interpreter:
        raise UsageError("--calibrate measures a GPU and none is in use here (pass --allow-interpreter to exercise "
                         "it through Triton's interpreter; its table says nothing about speed)")
    if ops:  # --op names benchmark rows; calibrate the ops behind them (the families name them)
        rows, ops = ops, bench.symbols_of(ops)
        from python_native.tools.bench.calibrating import _calibration_args

        if not set(ops) & set(_calibration_args()):
            raise UsageError(f"--op {','.join(rows)}: no calibration call is built for {', '.join(ops)}; "
                             "`bench` without --calibrate times their rows")

    target = Path(args.output).expanduser().parent if args.output else calibration.sources.user_dir()
    problem = calibration.store.unwritable(target)
    if problem is not None:
        raise UsageError(f"cannot write a calibration table into {problem}; pass --output FILE to write it elsewhere") from None
    steps = bench.calibration_steps(dtypes, args.quick, ops)
    bar = Progress(sum(len(dsls) for _, dsls, _, _ in steps), "calibrating", sys.stderr)

    def progress(row: dict | None, done: int, total: int) -> None:
        bar.step("" if row is None else
                 f"{row['dsl']:<8} {row['op']:<28} {row['dtype']:<9} bucket {row['bucket']:>2} "
                 f"{'x'.join(map(str, row['shape'])):>12} {row['override_ms']:10.4f} {row['aten_ms']:10.4f} "
                 f"{row['speedup']:6.2f}x {'wins' if row['wins'] else 'loses'}")

    unmeasured = _unmeasured_left_out()
    if unmeasured:
        print(f"note: not installed here, so not calibrated: {', '.join(unmeasured)} (no GPU has timed them yet; "
              "set PYTHON_NATIVE_UNMEASURED=1 to install and calibrate them)", file=sys.stderr)
    try:
        table = bench.calibrate(device, dtypes, args.quick, ops, args.threshold, progress)
    finally:
        elapsed = bar.close()
    try:
        path = calibration.save_table(table, args.output)
    except OSError as e:
        where = args.output or calibration.sources.user_dir()
        raise UsageError(f"cannot write the calibration table to {where} ({e}); pass --output FILE to write it elsewhere") from None
    losing = sum(not r["wins"] for r in table["rows"])
    print(f"calibration table for {table['device']!r} written to {path}: {len(table['rows'])} rows, "
          f"{losing} where aten is faster; calibrated in {elapsed:.1f} s")
    if args.output:
        print(f"use it with {calibration.ENV_VAR}={path}")
    else:
        print("in force from now on for every process on this machine (the user's tables; "
              "`python -m python_native calibration` lists them)")
    return 0


def _unmeasured_left_out() -> list[str]:
    """Ops each DSL left out for want of GPU timings (``dsl_support.unmeasured_reason``)."""
    import python_native as pn

    return sorted({op for dsl in pn.status()["dsls"] for op, why in dsl["skipped"].items() if "not yet timed" in why})
