"""``python -m python_native [COMMAND]``: the status report by default; the commands live in
``python_native.tools.commands`` (``cli`` parses the command line and runs the chosen one)."""

from __future__ import annotations

import importlib
import sys


def _cli():
    return importlib.import_module("python_native.tools.commands.cli")


def main(argv: list[str] | None = None) -> int:
    """Run the command named in ``argv`` (default: ``sys.argv[1:]``); its exit status."""
    return _cli().main(argv)


def _parser(json_errors: bool = False):
    return _cli().parser(json_errors)


if __name__ == "__main__":
    sys.exit(main())
