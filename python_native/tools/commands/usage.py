"""Bad command lines answered in one line, before any work starts, and never with a traceback.

Every command checks its values and paths up front and raises ``UsageError`` with one line naming
the value and what is allowed; ``python_native.__main__`` prints it (as JSON under ``--json``) and
exits 2. argparse's own complaints (an unknown option, a value of the wrong type) take the same
form through ``Parser``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, TextIO

EXIT_USAGE = 2
PROG = "python -m python_native"


class UsageError(ValueError):
    """A value or path on the command line that the command cannot use; the message is one line."""


def report(command: str, message: str, as_json: bool, stream: TextIO | None = None) -> None:
    """Print one error: ``{"error": ..., "command": ...}`` under ``--json`` (on stdout unless
    ``stream`` says otherwise), one line on stderr otherwise."""
    message = " ".join(str(message).split())
    if as_json:
        print(json.dumps({"error": message, "command": command or None}), file=stream or sys.stdout)
    else:
        print(f"{PROG}{' ' + command if command else ''}: {message}", file=stream or sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (JSON when ``json_errors``) instead of the usage block."""

    def __init__(self, *args, json_errors: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.json_errors = json_errors

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        report(command, f"{message} (see {self.prog} --help)", self.json_errors)
        sys.exit(EXIT_USAGE)


def writable_file(option: str, path: str | None, suffixes: tuple[str, ...] = ()) -> Path | None:
    """``path`` as a ``Path`` when a file can be written there (its folder exists and is writable,
    it is not a folder, its suffix is one of ``suffixes`` when given); raises ``UsageError``."""
    if path is None:
        return None
    target = Path(path).expanduser()
    folder = target.parent
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name in it")
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: folder {folder} does not exist; create it or write elsewhere")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path}: folder {folder} is not writable; write elsewhere")
    if suffixes and target.suffix.lower().lstrip(".") not in suffixes:
        raise UsageError(f"{option} {path}: unknown file type {target.suffix or '(none)'!r}; "
                         f"allowed: {', '.join('.' + s for s in suffixes)}")
    from python_native.foundations import safe_write

    try:
        safe_write.check(target)  # the write rules, before the run rather than at its end
    except safe_write.Untrusted as e:
        raise UsageError(f"{option} {path}: {e.line()}") from None
    return target


def writable_folder(option: str, path: str | None) -> Path | None:
    """``path`` when it is a folder we can write in, or one we can create; raises ``UsageError``."""
    if path is None:
        return None
    target = Path(path).expanduser()
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a folder; give a folder")
    if not os.access(existing, os.W_OK):
        raise UsageError(f"{option} {path}: {existing} is not writable; give a folder you can write to")
    return target


def one_of(option: str, values: Sequence[str] | None, allowed: Sequence[str]) -> None:
    """Raise ``UsageError`` naming the ``values`` that are not ``allowed``, with close matches."""
    wrong = [v for v in values or () if v not in allowed]
    if wrong:
        close = sorted({c for v in wrong for c in difflib.get_close_matches(v, allowed, n=2, cutoff=0.6)})
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UsageError(f"{option} {', '.join(map(repr, wrong))} unknown; {hint}allowed: {', '.join(allowed)}")


def at_least(option: str, value: int | float | None, minimum: int | float, meaning: str = "") -> None:
    """Raise ``UsageError`` unless ``value`` is None or ``>= minimum``."""
    if value is not None and not value >= minimum:
        raise UsageError(f"{option} {value}: must be >= {minimum}{f' ({meaning})' if meaning else ''}")
