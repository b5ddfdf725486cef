"""``python -m python_native [status] [--json]``: torch, DSLs and overrides at a glance."""

from __future__ import annotations

import argparse

HELP = "print the status report: torch, each DSL and every installed override (the default command)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    import python_native  # noqa: F401  (mounts and registers the built-in DSLs)
    from python_native.tools import report

    data = report.collect()
    print(report.to_json(data) if args.json else report.render(data))
    return 0
