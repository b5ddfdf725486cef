"""``python -m python_native calibration``: the calibration tables found, what gates each device, and
deleting the user's own tables."""

from __future__ import annotations

import argparse
import sys

HELP = "list the calibration tables and what gates each device (tables or the portable policy); delete the user's tables"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print it as JSON")
    parser.add_argument("--delete-user-tables", action="store_true",
                        help="delete the tables `bench --calibrate` wrote into the user's cache dir")
    parser.add_argument("--device", default=None, metavar="KEY",
                        help="with --delete-user-tables: only this device's (e.g. 'NVIDIA H100 80GB HBM3/sm90')")


def run(args: argparse.Namespace) -> int:
    import python_native  # noqa: F401  (mounts and registers the built-in DSLs)
    from python_native.features import calibration
    from python_native.tools import report

    if args.device and not args.delete_user_tables:
        print("python -m python_native calibration: --device only goes with --delete-user-tables", file=sys.stderr)
        return 2
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
    if args.json:
        print(report.to_json(info))
    else:
        print("\n".join(["Calibration (where each override beats aten, per device)",
                         *report.calibration_lines(info, detail=True)]))
    return 0
