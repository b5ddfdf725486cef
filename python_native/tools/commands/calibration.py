"""``python -m python_native calibration``: the calibration tables found, what gates each device, and
deleting the user's own tables."""

from __future__ import annotations

import argparse

from python_native.tools.commands.usage import UsageError

HELP = "list the calibration tables and what gates each device (tables or the portable policy); delete the user's tables"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print it as JSON")
    parser.add_argument("--op", "--ops", dest="op", action="append", metavar="NAME",
                        help="show only these ops' gates (repeatable, or a comma list): a public name (softmax) or an "
                             "aten name (_softmax, sum.dim_IntList), by the panel's rule")
    parser.add_argument("--delete-user-tables", action="store_true",
                        help="delete the tables `bench --calibrate` wrote into the user's cache dir")
    parser.add_argument("--device", default=None, metavar="KEY",
                        help="with --delete-user-tables: only this device's (e.g. 'NVIDIA H100 80GB HBM3/sm90')")


def _only(info: dict, ops: list[str]) -> dict:
    """``info`` with each device's gates and left-out ops kept for ``ops`` only."""
    wanted = set(ops)
    devices = [{**d, "thresholds": {dsl: {op: v for op, v in per_op.items() if op in wanted}
                                    for dsl, per_op in d["thresholds"].items()},
                "left_out": {dsl: [op for op in left if op in wanted] for dsl, left in d["left_out"].items()}}
               for d in info["devices"]]
    left_out = {key: {dsl: {op: why for op, why in per_op.items() if op in wanted} for dsl, per_op in per_dsl.items()}
                for key, per_dsl in (info.get("left_out") or {}).items()}
    left_out = {key: {dsl: ops for dsl, ops in per_dsl.items() if ops} for key, per_dsl in left_out.items()}
    return {**info, "devices": devices, "left_out": {key: v for key, v in left_out.items() if v}, "ops": ops}


def run(args: argparse.Namespace) -> int:
    if args.device and not args.delete_user_tables:
        raise UsageError("--device only goes with --delete-user-tables")
    if args.op and args.delete_user_tables:
        raise UsageError("--op only selects what is shown; --delete-user-tables deletes whole tables (choose with --device)")
    import python_native  # noqa: F401  (mounts and registers the built-in DSLs)
    from python_native.features import calibration
    from python_native.tools import report
    from python_native.tools.commands.names import catalogue, for_ops

    ops = for_ops("--op", sorted({op for ops in catalogue().names.values() for op in ops}), "op").resolve(args.op)
    if args.delete_user_tables:
        removed = calibration.store.delete_user_tables(args.device)
        calibration.reset()
        for path in removed:
            print(f"deleted {path}")
        if not removed:
            print(f"no user calibration table{' for ' + repr(args.device) if args.device else ''} in "
                  f"{calibration.sources.user_dir()}")
        return 0
    info = calibration.describe()
    if ops:
        info = _only(info, ops)
    if args.json:
        print(report.to_json(info))
    else:
        print("\n".join(["Calibration (where each override beats aten, per device)"
                         + (f": {', '.join(ops)} only" if ops else ""),
                         *report.calibration_lines(info, detail=True)]))
    return 0
