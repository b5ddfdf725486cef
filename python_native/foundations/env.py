"""Environment switches, read where they are consulted so tests and tools can set them.

This is the one list of the variables python-native reads: every reader asks this module, and the
status report lists ``SWITCHES``. Where torch's in-tree ``torch._native`` has a name for the same
switch, ours comes first and torch's second, so a process configured for one is configured for the
other. Each variable is read by its rule (``RULES``, carried out by ``env_rules``): the reading of
the library that reads it too (torch, Triton, CuTe DSL, the XDG rule), else python-native's own
(spaces around a value ignored, empty is unset). Values are validated where they are read: a value
its rule refuses is warned about once in one line, counts as unset (the default), and is named in
the status report (see ``faults``), cut short when long. ``docs/environment.md`` tabulates them.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from python_native.foundations import env_rules as rules
from python_native.foundations import faults

DISABLE_ALL = ("PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT")
SKIP_VERSION_CHECK = ("PYTHON_NATIVE_SKIP_VERSION_CHECK", "TORCH_NATIVE_SKIP_VERSION_CHECK")
ORDER_FN = ("PYTHON_NATIVE_ORDER_FN", "TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN")
DUMP_DIR = ("PYTHON_NATIVE_DUMP_DIR",)
TRITON_INTERPRET = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")
CHECK = ("PYTHON_NATIVE_CHECK",)
FRONT = ("PYTHON_NATIVE_FRONT",)
BACKGROUND_BUILD = ("PYTHON_NATIVE_BACKGROUND_BUILD",)
CALIBRATION = ("PYTHON_NATIVE_CALIBRATION",)
UNMEASURED = ("PYTHON_NATIVE_UNMEASURED",)
BENCHMARK = ("PYTHON_NATIVE_BENCHMARK",)
BENCHMARK_UNMEASURED = "unmeasured"  # its value for "only where no table speaks"
CUTEDSL = ("PYTHON_NATIVE_CUTEDSL",)
CACHE_DIR = ("PYTHON_NATIVE_CACHE_DIR",)
CUTE_DSL_ARCH = ("CUTE_DSL_ARCH",)  # CuTe DSL's own variable, honoured by our compile path too
XDG_CACHE_HOME = ("XDG_CACHE_HOME",)  # the standard user cache base, under which our caches live
CXX = ("CXX",)  # the C++ compiler the compiled front is built with
VARIANTS = ("PYTHON_NATIVE_VARIANTS",)
REPLAY = ("PYTHON_NATIVE_REPLAY",)
TORCH_LOGS = ("TORCH_LOGS",)  # torch's own logging switch, which our logger names join

# Every switch with what it does, for the status report (keep in step with the readers below).
SWITCHES: tuple[tuple[tuple[str, ...], str], ...] = (
    (DISABLE_ALL, "every override off for the process (registrations recorded, never routed to)"),
    (SKIP_VERSION_CHECK, "DSL version gates pass whatever version is installed"),
    (ORDER_FN, "dotted path of a function ordering each slot's overrides"),
    (DUMP_DIR, "folder where every generated router is written"),
    (TRITON_INTERPRET, "run Triton kernels through Triton's CPU interpreter, overrides at the CPU key"),
    (CHECK, "checked mode: compare every fired override with aten's kernel (read at registration)"),
    (FRONT, "which dispatch front serves: python (the routers alone) or compiled (built if needed); "
            "unset: the compiled front where a build is cached"),
    (BACKGROUND_BUILD, "0 stops the first process that finds no compiled front from building it in the background "
                       "(default: on)"),
    (CALIBRATION, "calibration tables to use instead of yours and the shipped ones (a file or folder); "
                  "'portable': the portable policy alone; 'off': no gate"),
    (UNMEASURED, "install overrides no GPU has timed yet at GPU keys too (to calibrate or test them)"),
    (BENCHMARK, "seeds pn.benchmark: 1 measures each override against aten on a GPU the first time a call "
                "meets a size no table measured ('unmeasured': only where no table speaks)"),
    (CUTEDSL, "the CuTe DSL overrides route calls from the start (read when they install, at import)"),
    (CACHE_DIR, "folder of the compiled-kernel cache (default: $XDG_CACHE_HOME or ~/.cache, python-native/kernels)"),
    (CUTE_DSL_ARCH, "GPU architecture CuTe DSL kernels are compiled for, in place of the device's (e.g. sm_90a)"),
    (XDG_CACHE_HOME, "user cache base folder; python-native's caches default to python-native/ under it"),
    (CXX, "the C++ compiler the compiled dispatch front is built with (default: c++)"),
    (VARIANTS, "the variant each op's override runs, 'op=name;...' ('aten': the original kernel); "
               "read at import, applied as each override registers"),
    (REPLAY, "the compiled front replays the recorded launches of a hit without entering Python: 1 on, 0 off; "
             "unset: on where a GPU run proved it for this GPU and these torch and Triton versions"),
    (TORCH_LOGS, "torch's logging switch: python_native (registration), +python_native (and each override), "
                 "python_native_compile (kernel compiles)"),
)

# How each variable is read (``env_rules``): another library's reading where it reads it too.
RULES: dict[str, str] = {
    **{name: "flag" for names in (DISABLE_ALL, SKIP_VERSION_CHECK, TRITON_INTERPRET, CHECK, BACKGROUND_BUILD,
                                  UNMEASURED, CUTEDSL, REPLAY) for name in names[:1]},
    **{name: "text" for names in (ORDER_FN, FRONT, BENCHMARK, VARIANTS) for name in names[:1]},
    **{name: "path" for names in (DUMP_DIR, CALIBRATION, CACHE_DIR) for name in names},
    DISABLE_ALL[1]: "torch flag", SKIP_VERSION_CHECK[1]: "torch flag", ORDER_FN[1]: "torch text",
    TRITON_INTERPRET[1]: "Triton flag", CUTE_DSL_ARCH[0]: "CuTe DSL text", XDG_CACHE_HOME[0]: "XDG path",
    CXX[0]: "torch text", TORCH_LOGS[0]: "torch logs",
}
FLAG_SPELLINGS = rules.FLAG_SPELLINGS


def _text(name: str) -> str | None:
    """``name``'s value by its rule, None when it reads as unset (a path no file system holds included)."""
    rule, raw = RULES.get(name, "text"), os.environ.get(name)
    if rule in ("torch text", "torch logs", "torch flag", "Triton flag"):
        return raw or None  # os.getenv's value as it is; empty reads as unset
    if rule == "CuTe DSL text":
        return raw  # CuTe DSL takes any value it is set to, even an empty one
    if rule == "XDG path":
        return rules.xdg_path(name, raw)
    value = rules.ours(raw)
    return rules.path(name, value) if rule == "path" else value


def _first(names: tuple[str, ...]) -> str | None:
    found = _first_set(names)
    return found[1] if found is not None else None


def _first_set(names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = _text(name)
        if value is not None:
            return name, value
    return None


def _on(name: str) -> bool:
    rule, raw = RULES.get(name, "flag"), os.environ.get(name)
    if rule == "torch flag":
        return rules.torch_flag(name, raw)
    if rule == "Triton flag":
        return rules.triton_flag(name, raw)
    return bool(rules.our_flag(name, raw))


def _flag(names: tuple[str, ...]) -> bool:
    """Whether any of ``names`` is on, each read by its own rule; a value its rule refuses counts
    as off, warned about once and named in the status report."""
    return any([_on(name) for name in names])  # a list: every name is read (and reported)


def overrides_disabled() -> bool:
    """Every override off for the process: registrations are recorded but never routed to."""
    return _flag(DISABLE_ALL)


def skip_version_check() -> bool:
    """DSL version gates pass whatever version is installed."""
    return _flag(SKIP_VERSION_CHECK)


_DOTTED = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)+")


def order_fn_setting() -> tuple[str, str] | None:
    """``(variable, dotted path)`` of the ordering function, naming whichever variable set it (a
    value that is no dotted path is reported, and the default order used)."""
    found = _first_set(ORDER_FN)
    if found is not None and _DOTTED.fullmatch(found[1]) is None:
        rules.bad(found[0], f"ordering function {rules.shown(found[1])} is not a dotted path such as "
                  "pkg.module.function", "the default order is used")
        return None
    return found


def dump_dir() -> str | None:
    """Folder where every generated router is written for debugging."""
    return _first(DUMP_DIR)


def triton_interpret() -> bool:
    """Run Triton kernels through Triton's interpreter, on CPU tensors."""
    return _flag(TRITON_INTERPRET)


def calibration_path() -> str | None:
    """The calibration table file or folder named by the user, or None (the packaged tables)."""
    return _first(CALIBRATION)


def cutedsl_opted_in() -> bool:
    """The CuTe DSL overrides route calls from the start instead of waiting for ``pn.cutedsl.enable()``."""
    return _flag(CUTEDSL)


def cache_dir() -> str | None:
    """The kernel cache folder named by the user, or None (the default under the user cache base)."""
    return _first(CACHE_DIR)


def user_cache_base() -> str | None:
    """``$XDG_CACHE_HOME`` when set to an absolute path (the XDG rule), else None."""
    return _first(XDG_CACHE_HOME)


_ARCH = re.compile(r"sm_\d{2,3}[af]?")


def cute_dsl_arch() -> str | None:
    """The architecture CuTe DSL kernels are compiled for when set (``sm_90a``), else None (a value
    that is no architecture, an empty one included, is reported: the device's own is used)."""
    value = _first(CUTE_DSL_ARCH)
    if value is None or _ARCH.fullmatch(value):
        rules.fine(CUTE_DSL_ARCH[0])
        return value
    rules.bad(CUTE_DSL_ARCH[0], f"{rules.shown(value)} is not a GPU architecture",
              "use the form sm_90a (sm_<major><minor>, optionally a or f); the device's own is used")
    return None


def cxx() -> str | None:
    """The C++ compiler named by ``$CXX`` (as torch's C++ extensions read it: the value as it is,
    even empty), or None when unset."""
    return os.environ.get(CXX[0])


def compiler_program() -> str | None:
    """The C++ compiler on PATH that ``$CXX`` names (as it is), else ``c++``; None when there is none
    (a set ``$CXX`` that names no program is reported)."""
    name = cxx()
    found = shutil.which("c++" if name is None else name)
    if found is None and name is not None:
        rules.bad(CXX[0], f"{rules.shown(name)} is no program on PATH",
                  "set it to a C++ compiler (g++, clang++), or unset it for c++; the compiled front is not built")
    elif name is not None:
        rules.fine(CXX[0])
    return found


def torch_logs() -> str:
    """torch's ``TORCH_LOGS`` setting as torch parses it, spaces taken out ("" when unset, or when
    torch refuses it), where it names our loggers too."""
    return rules.torch_logs(TORCH_LOGS[0], os.environ.get(TORCH_LOGS[0]))


@contextmanager
def torch_logs_without(names: Sequence[str]) -> Iterator[None]:
    """``TORCH_LOGS`` with the settings of ``names`` (``+name``, ``-name``, ``name``) left out while
    the block runs (for torch's own import, which refuses names not registered yet); restored after.
    A setting torch refuses whatever it names is left as it is, for torch to answer."""
    name = TORCH_LOGS[0]
    setting, parsed = os.environ.get(name), torch_logs()
    if not setting or not parsed:
        yield
        return
    kept = ",".join(sign + entry for sign, entry in rules.names_torch_logs_sets(parsed) if entry not in names)
    if kept:
        os.environ[name] = kept
    else:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ[name] = setting


def triton_runtime_interprets() -> bool:
    """Whether Triton's own ``TRITON_INTERPRET`` is on, read as Triton reads it as its kernels are defined."""
    return _flag(TRITON_INTERPRET[1:])


def check_overrides() -> bool:
    """Checked mode, read at each registration: every fired override is compared with aten's kernel
    on the same inputs and a difference raises ``python_native.features.checked.OverrideMismatch``."""
    return _flag(CHECK)


FRONT_CHOICES = ("python", "compiled")


def front_setting() -> str | None:
    """``PYTHON_NATIVE_FRONT`` as set (lower case), None when unset or not a choice (reported)."""
    value = _first(FRONT)
    if value is None or value.lower() in FRONT_CHOICES:
        rules.fine(FRONT[0])
        return value.lower() if value is not None else None
    rules.bad(FRONT[0], f"{rules.shown(value)} is not one of {list(FRONT_CHOICES)}", "treated as unset")
    return None


def background_build_allowed() -> bool:
    """Whether a process that finds no compiled front may start its build in the background (on
    unless set to a false spelling; a malformed value warns once and counts as unset)."""
    return rules.our_flag(BACKGROUND_BUILD[0], os.environ.get(BACKGROUND_BUILD[0]), default="unset (on)") is not False


def replay_setting() -> bool | None:
    """``PYTHON_NATIVE_REPLAY`` as a flag, None when unset (or not a flag value: warned about once)."""
    return rules.our_flag(REPLAY[0], os.environ.get(REPLAY[0]), default="unset")


def unmeasured_allowed() -> bool:
    """Overrides no calibration table has timed are installed at GPU keys too (read at registration)."""
    return _flag(UNMEASURED)


def benchmark_mode() -> bool | str:
    """``PYTHON_NATIVE_BENCHMARK``: True for a true flag spelling, ``"unmeasured"``, else False (a
    value that is neither warns once, counts as unset and is named in the status report)."""
    value = _first(BENCHMARK)
    if value is not None and value.lower() == BENCHMARK_UNMEASURED:
        faults.resolve(BENCHMARK[0])
        return BENCHMARK_UNMEASURED
    if value is not None and value.lower() not in rules.TRUTHY | rules.FALSY:
        rules.bad(BENCHMARK[0], f"{rules.shown(value)} is not a flag value nor {BENCHMARK_UNMEASURED!r}",
                  f"use {FLAG_SPELLINGS}, or {BENCHMARK_UNMEASURED}; treated as unset (off)")
        return False
    return _flag(BENCHMARK)


def variant_choices() -> list[tuple[str, str]]:
    """``PYTHON_NATIVE_VARIANTS`` as ``(op, variant)`` pairs, in order (``"aten::_softmax=aten;bmm=default"``).

    Entries are separated by ``;``; an entry that is not ``op=name`` (an identifier for the name)
    is dropped, and all such entries are named in one warning: a bad entry never fails ``import torch``.
    """
    found = _first_set(VARIANTS)
    if found is None:
        faults.resolve(VARIANTS[0])
        return []
    pairs, malformed = [], []
    for entry in found[1].split(";"):
        entry = entry.strip()
        if not entry:
            continue
        op, sep, name = (part.strip() for part in entry.partition("="))
        symbol = op.replace("::", ".", 1)
        if sep and op and name.isidentifier() and all(part.isidentifier() for part in symbol.split(".")):
            pairs.append((op, name))
        else:
            malformed.append(entry)
    if malformed:
        rules.bad(VARIANTS[0], f"malformed entries {rules.shown(';'.join(malformed))} dropped",
                  "write each entry as op=variant, separated by ';' (e.g. 'aten::_softmax=aten;bmm=default')")
    else:
        faults.resolve(VARIANTS[0])
    return pairs


PREFIX = "PYTHON_NATIVE_"


def check_unknown() -> list[str]:
    """Name each set ``PYTHON_NATIVE_*`` variable that no switch reads (a misspelling reads as unset),
    with the switch it resembles: warned once and kept in the status report. Returns them."""
    known = sorted({name for names, _ in SWITCHES for name in names if name.startswith(PREFIX)})
    unknown = sorted(name for name in os.environ if name.startswith(PREFIX) and name not in known)
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        fix = f"did you mean {close[0]}?" if close else f"the variables read are {', '.join(known)}"
        rules.bad(name, "no such variable: python_native ignores it", fix)
    return unknown


def import_time_values() -> tuple[str | None, ...]:
    """The raw values of the switches whose effect is fixed when the overrides install at import
    (the panel compares them later, to honour or refuse a change: ``bootstrap.apply_env_changes``)."""
    return tuple(os.environ.get(name) for name in (*DISABLE_ALL, *TRITON_INTERPRET))


_READERS = {
    DISABLE_ALL: overrides_disabled, SKIP_VERSION_CHECK: skip_version_check, ORDER_FN: order_fn_setting,
    DUMP_DIR: dump_dir, TRITON_INTERPRET: triton_interpret, CHECK: check_overrides, FRONT: front_setting,
    BACKGROUND_BUILD: background_build_allowed, CALIBRATION: calibration_path, UNMEASURED: unmeasured_allowed,
    BENCHMARK: benchmark_mode, CUTEDSL: cutedsl_opted_in, CACHE_DIR: cache_dir, CUTE_DSL_ARCH: cute_dsl_arch,
    XDG_CACHE_HOME: user_cache_base, CXX: compiler_program, VARIANTS: variant_choices, REPLAY: replay_setting,
    TORCH_LOGS: torch_logs,
}


def current() -> list[dict[str, str | None]]:
    """Each switch: its name, the variable that set it (when an alias did), its value, its meaning,
    and what is wrong with the value (``problem``, None when nothing is)."""
    rows = []
    for names, meaning in SWITCHES:
        _READERS[names]()  # each value checked by its reader, so its problem is listed even before it is used
        found = _first_set(names)
        problems = [p for p in (faults.problem_of(name) for name in names) if p is not None]
        rows.append(
            {
                "name": names[0],
                "set_by": found[0] if found is not None else None,
                "value": rules.cut(found[1]) if found is not None else None,
                "meaning": meaning,
                "problem": "; ".join(problems) or None,
            }
        )
    return rows
