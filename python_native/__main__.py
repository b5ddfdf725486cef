"""``python -m python_native``: status report (``--json`` for machines), or ``demo``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m python_native", description=__doc__)
    parser.add_argument("command", nargs="?", choices=["status", "demo"], default="status")
    parser.add_argument("--json", action="store_true", help="print the status report as JSON")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from python_native import demo

        return demo.main(rest)
    import python_native  # noqa: F401  (mounts and registers the built-in DSLs)
    from python_native import report

    data = report.collect()
    print(report.to_json(data) if args.json else report.render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
