"""The command line: the parser over every command module, and ``main``, which keeps tracebacks from users.

Commands live beside this module, one each with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``, imported only when chosen so that the report never pays for a benchmark's or a
compiler's imports. A bad value is answered in one line (``UsageError``, exit 2), an unexpected
failure in one line naming a file that holds its traceback (exit 1); both as JSON under ``--json``.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from python_native.foundations.safe_write import Untrusted
from python_native.tools.commands.usage import EXIT_USAGE, PROG, Parser, UsageError, report

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


def parser(json_errors: bool = False) -> Parser:
    """Every command's options; errors in one line (JSON with ``json_errors``)."""
    top = Parser(
        prog=PROG,
        description="python-native: status report and tools (run a command with --help for its options).",
        json_errors=json_errors,
    )
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"python_native.tools.commands.{module_name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP, json_errors=json_errors)
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (the status report when it names none); its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, next(iter(COMMANDS)))  # `python -m python_native --json` is the status report
    as_json = "--json" in argv
    args, extra = parser(as_json).parse_known_args(argv)
    if extra:  # named by the command they were given to, not by the top-level parser
        report(args.command, f"unrecognized arguments: {' '.join(extra)} (see {PROG} {args.command} --help)", as_json)
        return EXIT_USAGE
    try:
        return args._module.run(args)
    except UsageError as e:
        report(args.command, str(e), as_json)
        return EXIT_USAGE
    except Untrusted as e:  # a write the rules refuse (a link or another user's file at its name...)
        report(args.command, f"will not write {e.line()}", as_json)
        return 1
    except BrokenPipeError:  # `python -m python_native | head`: the reader left, nothing to report
        sys.stdout = None
        return 0
    except KeyboardInterrupt:
        report(args.command, "interrupted", as_json)
        return 130
    except Exception as e:  # a bug: one line for the user, the traceback kept for the report
        report(args.command, f"failed: {type(e).__name__}: {e} (traceback in {_keep_traceback(args.command)}; "
               "please include it when reporting this)", as_json)
        return 1


def _keep_traceback(command: str) -> str:
    """Write the exception being handled to a new file in the temporary folder; its path."""
    from python_native.foundations import safe_write

    return str(safe_write.new_temp_file(traceback.format_exc(), prefix=f"python-native-{command}-", suffix=".txt"))

