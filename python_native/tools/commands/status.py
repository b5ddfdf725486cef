"""``python -m python_native [status] [--json]``: torch, DSLs and overrides at a glance."""

from __future__ import annotations

import argparse

HELP = "print the status report: torch, each DSL and every installed override (the default command)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    import python_native  # noqa: F401  (mounts and registers the built-in DSLs)
    from python_native.panel import snapshot
    from python_native.tools import report

    data = report.collect()
    data["no_override_runs"] = snapshot.no_override_reason()  # the one thing to do when nothing can run
    if args.json:
        print(report.to_json(data))
    else:
        print(report.render(data))
        if data["no_override_runs"]:
            print(f"\nNo override can run in this process: {data['no_override_runs']}")
    return 0
