"""Environment switches, read where they are consulted so tests and tools can set them.

Each switch has our own name first and the name torch's in-tree ``torch._native`` uses second,
so a process configured for one is configured for the other. Values are validated where they are
read: a flag that is not one of the accepted spellings is warned about once, counts as unset (the
default), and is named in the status report (see ``faults``).
"""

from __future__ import annotations

import os

from python_native import faults

DISABLE_ALL = ("PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT")
SKIP_VERSION_CHECK = ("PYTHON_NATIVE_SKIP_VERSION_CHECK", "TORCH_NATIVE_SKIP_VERSION_CHECK")
ORDER_FN = ("PYTHON_NATIVE_ORDER_FN", "TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN")
DUMP_DIR = ("PYTHON_NATIVE_DUMP_DIR",)
TRITON_INTERPRET = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")
CHECK = ("PYTHON_NATIVE_CHECK",)
CUTEDSL = ("PYTHON_NATIVE_CUTEDSL",)

# Every switch with what it does, for the status report (keep in step with the readers below).
SWITCHES: tuple[tuple[tuple[str, ...], str], ...] = (
    (DISABLE_ALL, "every override off for the process (registrations recorded, never routed to)"),
    (SKIP_VERSION_CHECK, "DSL version gates pass whatever version is installed"),
    (ORDER_FN, "dotted path of a function ordering each slot's overrides"),
    (DUMP_DIR, "folder where every generated router is written"),
    (TRITON_INTERPRET, "run Triton kernels through Triton's CPU interpreter, overrides at the CPU key"),
    (CHECK, "checked mode: compare every fired override with aten's kernel (read at registration)"),
    (CUTEDSL, "the CuTe DSL overrides route calls from the start (installed disabled otherwise)"),
)

_FALSY = frozenset({"", "0", "false", "no", "off"})
_TRUTHY = frozenset({"1", "true", "yes", "on"})
FLAG_SPELLINGS = "1/0, true/false, yes/no or on/off"


def _first(names: tuple[str, ...]) -> str | None:
    found = _first_set(names)
    return found[1] if found is not None else None


def _first_set(names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip():
            return name, value.strip()
    return None


def _flag(names: tuple[str, ...]) -> bool:
    """Whether any of ``names`` is set to a true spelling; a value that is neither true nor false
    counts as unset (off), warned about once and named in the status report."""
    on = False
    for name in names:
        value = os.environ.get(name)
        if value is None:
            continue
        word = value.strip().lower()
        if word in _TRUTHY:
            on = True
        elif word not in _FALSY:
            faults.report(name, f"{value!r} is not a flag value", f"use {FLAG_SPELLINGS}; treated as unset (off)",
                          stacklevel=3)
            continue
        faults.resolve(name)
    return on


def overrides_disabled() -> bool:
    """Every override off for the process: registrations are recorded but never routed to."""
    return _flag(DISABLE_ALL)


def skip_version_check() -> bool:
    """DSL version gates pass whatever version is installed."""
    return _flag(SKIP_VERSION_CHECK)


def order_fn_path() -> str | None:
    """Dotted path of a user function that orders each slot's overrides."""
    return _first(ORDER_FN)


def order_fn_setting() -> tuple[str, str] | None:
    """``(variable, dotted path)`` of the ordering function, naming whichever variable set it."""
    return _first_set(ORDER_FN)


def dump_dir() -> str | None:
    """Folder where every generated router is written for debugging."""
    return _first(DUMP_DIR)


def triton_interpret() -> bool:
    """Run Triton kernels through Triton's interpreter, on CPU tensors."""
    return _flag(TRITON_INTERPRET)


def cutedsl_opted_in() -> bool:
    """The CuTe DSL overrides route calls from the start (they install disabled otherwise)."""
    return _flag(CUTEDSL)


def check_overrides() -> bool:
    """Checked mode, read at each registration: every fired override is compared with aten's kernel
    on the same inputs and a difference raises ``python_native.checked.OverrideMismatch``."""
    return _flag(CHECK)


def current() -> list[dict[str, str | None]]:
    """Each switch: its name, the variable that set it (when an alias did), its value, its meaning,
    and what is wrong with the value (``problem``, None when nothing is)."""
    rows = []
    for names, meaning in SWITCHES:
        found = _first_set(names)
        problems = [p for p in (faults.problem_of(name) for name in names) if p is not None]
        rows.append(
            {
                "name": names[0],
                "set_by": found[0] if found is not None else None,
                "value": found[1] if found is not None else None,
                "meaning": meaning,
                "problem": "; ".join(problems) or None,
            }
        )
    return rows
