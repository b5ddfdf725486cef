"""How each environment variable's value is read (``env`` hands each its value): one rule per
reader, and the value shown short.

A variable that another library reads too is read exactly as that library reads it, so the
two never disagree about one value (Triton's ``TRITON_INTERPRET``, torch's ``TORCH_*``, CuTe DSL's
``CUTE_DSL_ARCH``, the XDG base-directory ``XDG_CACHE_HOME``, torch's C++-extension ``CXX``).
python-native's own ``PYTHON_NATIVE_*`` variables follow one rule: spaces around the value are
ignored and an empty value is unset; a flag takes 1/0, true/false, yes/no or on/off in any case; a
path must be one a file system can hold. A value a rule refuses is reported (``faults``: warned
about once, in one line, and listed in the status report, shown cut to its first characters) and
the variable reads as unset, or as the other library reads the value where it reads it too.
"""

from __future__ import annotations

import os
import re

from python_native.foundations import faults

FALSY = frozenset({"", "0", "false", "no", "off"})
TRUTHY = frozenset({"1", "true", "yes", "on"})
FLAG_SPELLINGS = "1/0, true/false, yes/no or on/off"
SHOWN = 60  # characters of a value a message shows
PATH_MAX, NAME_MAX = 4096, 255  # bytes: the longest path and file name Linux takes
_TORCH_LOGS = re.compile(r"((\+|-)?[\w\.]+,\s*)*(\+|-)?[\w\.]+?")  # torch._logging's own pattern


def shown(value: str) -> str:
    """``value`` as messages show it: its repr, cut to its first characters when long."""
    if len(value) <= SHOWN + 20:
        return repr(value)
    return f"{value[:SHOWN]!r}…({len(value)} characters)"


def cut(value: str) -> str:
    """``value`` as the status report shows it: cut to its first characters when long."""
    return value if len(value) <= SHOWN + 20 else f"{value[:SHOWN]}…({len(value)} characters)"


_reported: dict[str, str] = {}  # variable -> the problem its rule last found with its value


def bad(name: str, problem: str, fix: str) -> None:
    """Report ``name``'s value (one line on stderr, once; kept for the status report)."""
    _reported[name] = problem
    faults.report(name, problem, fix, located=False)


def fine(name: str) -> None:
    """``name``'s value passes its rule: the problem the rule found is gone (one its users found with
    what the value names, an unwritable folder say, stays theirs to clear)."""
    if name in _reported and faults.problem_of(name) == _reported.pop(name):
        faults.resolve(name)


def ours(value: str | None) -> str | None:
    """A ``PYTHON_NATIVE_*`` value: spaces around it ignored, empty is unset."""
    if value is None or not value.strip():
        return None
    return value.strip()


def our_flag(name: str, raw: str | None, *, default: str = "unset (off)") -> bool | None:
    """A ``PYTHON_NATIVE_*`` flag: None when unset, or not a flag value (reported)."""
    value = ours(raw)
    if value is None:
        fine(name)
        return None
    word = value.lower()
    if word in TRUTHY or word in FALSY:
        fine(name)
        return word in TRUTHY
    bad(name, f"{shown(value)} is not a flag value", f"use {FLAG_SPELLINGS}; treated as {default}")
    return None


def triton_flag(name: str, value: str | None) -> bool:
    """Triton's reading (``triton.knobs``' ``env_bool``): on for 1, true, yes or on in any case,
    exactly, with no spaces; anything else is off. A value that is neither spelling is reported."""
    word = value.lower() if value is not None and value.isascii() else value
    if value is None or word in TRUTHY or word in FALSY:
        fine(name)
        return word in TRUTHY
    bad(name, f"{shown(value)} is off for Triton",
        "Triton takes 1, true, yes or on exactly (no spaces) as on, 0/false/no/off as off; read as off")
    return False


def torch_flag(name: str, value: str | None) -> bool:
    """torch's reading of its ``TORCH_*`` switches: ``int(value) == 1`` (unset: 0). A value that is
    not an integer (torch raises on it) or neither 0 nor 1 is reported, and read as off."""
    if value is None:
        fine(name)
        return False
    try:
        number = int(value)
    except ValueError:
        bad(name, f"{shown(value)} is not an integer", "torch reads it as int(value) == 1 (and raises on it); "
            "use 1 or 0; read as off")
        return False
    if number not in (0, 1):
        bad(name, f"{shown(value)} is off for torch", "torch reads it as int(value) == 1; use 1 or 0; read as off")
        return False
    fine(name)
    return number == 1


def path(name: str, value: str | None) -> str | None:
    """``value`` when a file system can hold it as a path, else None (reported)."""
    if value is None:
        fine(name)
        return None
    encoded = os.fsencode(value)
    if len(encoded) >= PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        bad(name, f"{shown(value)} is longer than a path can be",
            f"use a path under {PATH_MAX} bytes, each name under {NAME_MAX + 1}; treated as unset")
        return None
    fine(name)
    return value


def xdg_path(name: str, value: str | None) -> str | None:
    """The XDG base-directory rule: unset or empty means the default; a path that is not absolute
    is invalid and ignored (reported here)."""
    if not value:
        fine(name)
        return None
    if not os.path.isabs(value):
        bad(name, f"{shown(value)} is not an absolute path", "the XDG rule ignores it; ~/.cache is used")
        return None
    return path(name, value)


def torch_logs(name: str, value: str | None) -> str:
    """``TORCH_LOGS`` as torch parses it: its value with every space taken out ("" when unset or
    empty), or "" where torch's pattern refuses it (torch itself raises on such a value at import)."""
    if not value:
        fine(name)
        return ""
    if _TORCH_LOGS.fullmatch(value) is None:
        bad(name, f"{shown(value)} is not a setting torch accepts",
            "torch takes names separated by commas, each after an optional + or -, spaces only after a comma")
        return ""
    fine(name)
    return re.sub(r"\s+", "", value)


def names_torch_logs_sets(setting: str) -> list[tuple[str, str]]:
    """``(sign, name)`` for each entry of a ``TORCH_LOGS`` setting torch accepts (as ``torch_logs`` returns it)."""
    entries = []
    for entry in filter(None, setting.split(",")):
        sign = entry[0] if entry[0] in "+-" else ""
        entries.append((sign, entry.replace("+", "").replace("-", "")))
    return entries
