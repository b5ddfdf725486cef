"""``python -m python_native [COMMAND]``: the status report by default; each command is a module.

Commands live in ``python_native.tools.commands``, one module each with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``, imported only when chosen so that the report
never pays for a benchmark's or a compiler's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under python_native.tools.commands; the first is the default.
COMMANDS = {
    "status": "status",
    "demo": "demo",
    "bench": "bench",
    "calibration": "calibration",
    "precompile": "precompile",
    "inspect": "inspect",
    "verify": "verify",
    "reach": "reach",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m python_native",
        description="python-native: status report and tools (run a command with --help for its options).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"python_native.tools.commands.{module_name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, next(iter(COMMANDS)))  # `python -m python_native --json` is the status report
    args = _parser().parse_args(argv)
    try:
        return args._module.run(args)
    except BrokenPipeError:  # `python -m python_native | head`: the reader left, nothing to report
        sys.stdout = None
        return 0


if __name__ == "__main__":
    sys.exit(main())
