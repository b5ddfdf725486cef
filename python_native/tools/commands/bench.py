"""``python -m python_native bench``: overrides against aten (and Inductor, Liger, QuACK) on this machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "benchmark the overrides against aten on this device, or write a calibration table (--calibrate)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No import of python_native.tools.bench here: building the CLI parser must stay cheap for the status report.
    parser.add_argument("--quick", action="store_true", help="tiny shapes (what the Triton interpreter can run)")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16", help="comma-separated (default: %(default)s)")
    parser.add_argument("--ops", default=None, help="comma-separated subset of: rms_norm, layer_norm, softmax, log_softmax, silu, gelu, "
                        "gelu_tanh, bmm_outer, group_norm, group_norm_cl, dropout, sum, sum_dim0, mean, prod, amax, "
                        "amin, argmax, argmin, max_dim, min_dim, topk, scatter_add, index_add")
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


def _fail(message: str) -> int:
    print(f"python -m python_native bench: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from python_native.tools import bench

    if args.prove_replay:
        return _prove_replay(args)

    try:
        dtypes = bench.parse_dtypes(args.dtypes)
        ops = bench.parse_ops(args.ops)
        device = bench.pick_device(args.quick or args.calibrate)
    except (ValueError, RuntimeError) as e:
        return _fail(str(e))
    if device == "cpu":
        import torch

        torch.set_num_threads(1)  # tiny interpreter shapes: a thread pool only adds contention noise
    if args.calibrate:
        return _calibrate(args, device, dtypes, ops)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib (pip install matplotlib)")
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
    if rows and not any(r.fired for r in rows):
        return _fail("no override fired in any row: nothing was measured but aten (are the overrides "
                     "installed and switched on? see python -m python_native status)")
    return 0


def _prove_replay(args: argparse.Namespace) -> int:
    import json

    from python_native.features import calibration
    from python_native.features.front import proof
    from python_native.tools.bench import replay_proof

    results, problem = replay_proof.prove()
    if problem:
        return _fail(problem)
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
    from python_native.tools import bench

    Path(path).write_text(bench.json_document(env, rows) + "\n")


def _calibrate(args: argparse.Namespace, device: str, dtypes: list, ops: list[str] | None) -> int:
    from python_native.features import calibration
    from python_native.tools import bench
    from python_native.tools.bench.progress import Progress

    if not args.threshold > 0:
        return _fail(f"--threshold {args.threshold}: must be a positive aten/override time ratio (e.g. 1.0)")
    if device != "cuda" and not args.allow_interpreter:
        return _fail("--calibrate measures a GPU and none is in use here (pass --allow-interpreter to exercise "
                     "it through Triton's interpreter; its table says nothing about speed)")
    if ops:  # --ops names torch-level functions; calibrate the aten ops behind them
        symbols = {
            "rms_norm": ["_fused_rms_norm", "_fused_rms_norm_backward"],
            "layer_norm": ["native_layer_norm", "native_layer_norm_backward"],
            "softmax": ["_softmax", "_softmax_backward_data"],
            "log_softmax": ["_log_softmax", "_log_softmax_backward_data"],
            "silu": ["silu", "silu_backward"], "gelu": ["gelu", "gelu_backward"],
            "gelu_tanh": ["gelu", "gelu_backward"], "bmm_outer": ["bmm"],
            "sum": ["sum.dim_IntList"], "sum_dim0": ["sum.dim_IntList"], "mean": ["mean.dim"], "prod": ["prod.dim_int"],
            "amax": ["amax"], "amin": ["amin"], "argmax": ["argmax"], "argmin": ["argmin"], "max_dim": ["max.dim"],
            "min_dim": ["min.dim"],
            "topk": ["topk"], "scatter_add": ["scatter_add", "scatter_add_"], "index_add": ["index_add", "index_add_"],
            "group_norm": ["native_group_norm", "native_group_norm_backward"],
            "group_norm_cl": ["native_group_norm", "native_group_norm_backward"],
            "dropout": ["native_dropout", "native_dropout_backward", "bernoulli_.float"],
        }
        ops = [symbol for op in ops for symbol in symbols[op]]

    target = Path(args.output).expanduser().parent if args.output else calibration.sources.user_dir()
    problem = calibration.store.unwritable(target)
    if problem is not None:
        return _fail(f"cannot write a calibration table into {problem}; pass --output FILE to write it elsewhere")
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
        return _fail(f"cannot write the calibration table to {where} ({e}); pass --output FILE to write it elsewhere")
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
