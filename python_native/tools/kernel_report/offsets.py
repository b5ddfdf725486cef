"""Where a kernel computes an address in int32 arithmetic that can pass 2**31: read from its Triton IR.

Triton types ``tl.program_id`` and ``tl.arange`` as int32, and an int argument below 2**31 as
int32 too, so ``tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)`` or ``cols * stride`` is computed in
int32 (a later ``.to(tl.int64)`` comes too late) and wraps once the tensor holds 2**31 elements.
This module reads the TTIR of a kernel (compiled with every int argument an int32, the worst case)
and names the source lines of each such computation: an int32 ``addi``, ``subi``, ``muli`` or
``shli`` that an address depends on, one of whose operands grows with the launch (a program id,
an int argument, a loop counter over them, a loaded value). Constants and ``tl.arange`` do not
grow; ``x % C`` and ``min(x, C)`` with a constant ``C`` stay below it.

Each site is then either made int64 in the kernel or bounded by its op's cond, which declines
the calls that would reach 2**31 there (``exceptions.EXCEPTIONS`` names the bound, ``check``
reports a site none names). Plain text in, plain data out: no Triton import here.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

_VALUE = re.compile(r"%[\w$.-]+")
_DEF = re.compile(r"^\s*(%[\w$.-]+)(?::\d+)?\s+=\s+(.*)$")
_LOC_DEF = re.compile(r"^(#loc\d*)\s*=\s*loc\((.*)\)\s*$")
_FILE_LOC = re.compile(r'^"([^"]+)":(\d+):\d+')
_FOR = re.compile(r"scf\.for\s+(%[\w$.-]+)\s*=\s*(%[\w$.-]+)\s+to\s+(%[\w$.-]+)\s+step\s+(%[\w$.-]+)")
_ITER_ARG = re.compile(r"(%[\w$.-]+)\s*=\s*(%[\w$.-]+)")
_ARG = re.compile(r"(%[\w$.-]+):\s*(i\d+|!tt\.ptr<[^>]*>|[\w.]+)")
_BLOCK_ARG = re.compile(r"(%[\w$.-]+):\s*(i\d+)\b")

OVERFLOWING = frozenset({"arith.addi", "arith.subi", "arith.muli", "arith.shli"})
_LEAVES = frozenset({"arith.constant", "tt.make_range"})
_GROWING = frozenset({"tt.get_program_id", "tt.get_num_programs"})
_BY_DIVISOR = frozenset({"arith.remsi", "arith.remui"})
_BY_FIRST = frozenset({"arith.divsi", "arith.divui", "arith.shrsi", "arith.shrui", "arith.ceildivsi", "arith.floordivsi"})
_BY_ALL = frozenset({"arith.andi", "arith.minsi", "arith.minui"})
_DATA = frozenset({"tt.load", "tt.atomic_rmw", "tt.atomic_cas", "tt.call"})


@dataclass(frozen=True)
class Site:
    """An int32 computation an address depends on: where it is in the source."""

    file: str
    line: int

    @property
    def text(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def describe(self) -> str:
        return f"{self.text} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass
class _Op:
    name: str
    deps: tuple[str, ...]
    loc: str
    int32: bool = False


@dataclass
class _Function:
    ops: dict[str, _Op] = field(default_factory=dict)
    grows: dict[str, bool] = field(default_factory=dict)
    offsets: list[str] = field(default_factory=list)  # the offset operand of every tt.addptr


def _trailing_loc(text: str) -> tuple[str, str]:
    """``(text without its trailing loc(...), what the loc holds)``."""
    at = text.rfind(" loc(")
    if at < 0:
        return text, ""
    return text[:at], text[at + 5 : text.rfind(")")]


def _result_is_int32(op: str, body: str) -> bool:
    if op not in OVERFLOWING:
        return False
    kind = body.rsplit(" : ", 1)[-1].strip()
    return kind == "i32" or kind.endswith("xi32>")


def _grows(op: str, deps: tuple[str, ...], grows: dict[str, bool]) -> bool:
    flags = [grows.get(d, False) for d in deps]
    if op in _LEAVES:
        return False
    if op in _GROWING or op in _DATA or not deps:
        return op not in _LEAVES
    if op in _BY_DIVISOR:
        return flags[-1]
    if op in _BY_FIRST:
        return flags[0]
    if op in _BY_ALL:
        return all(flags)
    return any(flags)


def _parse(ttir: str) -> tuple[list[_Function], dict[str, str]]:
    """The functions of ``ttir`` (their ops, which values grow, every address offset) and its loc table."""
    locs: dict[str, str] = {}
    functions: list[_Function] = []
    fn: _Function | None = None
    for raw in ttir.splitlines():
        line = raw.strip()
        found = _LOC_DEF.match(line)
        if found:
            locs[found.group(1)] = found.group(2)
            continue
        if line.startswith("tt.func"):
            fn = _Function()
            functions.append(fn)
            header = line[line.find("(") + 1 :]
            for name, kind in _ARG.findall(header):
                fn.grows[name] = kind.startswith("i")
            continue
        if fn is None:
            continue
        if line.startswith("^"):
            for name, _ in _BLOCK_ARG.findall(line):
                fn.grows[name] = True  # a region's integer block argument: a reduced or scanned value
            continue
        _parse_op(fn, line)
    return functions, locs


def _parse_op(fn: _Function, line: str) -> None:
    found = _DEF.match(line)
    if found is None:
        return
    body, loc = _trailing_loc(found.group(2))
    result = found.group(1)
    op = body.split(None, 1)[0].strip('"').split("(")[0] if body else ""
    if op == "scf.for":
        loop = _FOR.search(body)
        iter_args = body[body.find("iter_args(") :] if "iter_args(" in body else ""
        if loop is not None:
            iv, bounds = loop.group(1), loop.group(2, 3, 4)
            fn.ops[iv] = _Op("scf.for", tuple(bounds), loc)
            fn.grows[iv] = any(fn.grows.get(b, False) for b in bounds)
        for carried, init in _ITER_ARG.findall(iter_args):
            fn.ops[carried] = _Op("scf.for", (init,), loc)
            fn.grows[carried] = True  # carried through iterations: may accumulate
        fn.ops[result] = _Op("scf.for", (), loc)
        fn.grows[result] = True
        return
    deps = tuple(v.split("#")[0] for v in _VALUE.findall(body.split(" : ", 1)[0]))
    fn.ops[result] = _Op(op, deps, loc, _result_is_int32(op, body))
    fn.grows[result] = _grows(op, deps, fn.grows)
    if op == "tt.addptr" and len(deps) == 2:
        fn.offsets.append(deps[1])


def _resolve(loc: str, locs: dict[str, str], depth: int = 0) -> tuple[str, int] | None:
    """The file and line a loc names (a call site's callee, a fused loc's first part)."""
    if depth > 32 or not loc:
        return None
    loc = loc.strip()
    if loc.startswith("#loc"):
        return _resolve(locs.get(loc.split()[0].rstrip(")"), ""), locs, depth + 1)
    found = _FILE_LOC.match(loc)
    if found:
        return found.group(1), int(found.group(2))
    if loc.startswith("callsite("):
        return _resolve(loc[len("callsite(") :].split(" at ", 1)[0], locs, depth + 1)
    if loc.startswith("fused"):
        inner = loc[loc.find("[") + 1 :]
        return _resolve(inner.split(",", 1)[0].rstrip("]"), locs, depth + 1)
    if loc.startswith('"'):  # a named loc: "name"(#locN)
        return _resolve(loc[loc.find("(") + 1 :].rstrip(")"), locs, depth + 1)
    return None


def int32_sites(ttir: str) -> list[Site]:
    """Every int32 computation that an address of ``ttir``'s kernel depends on and that can pass
    2**31 (see the module docstring), by source line, in line order."""
    functions, locs = _parse(ttir)
    sites: set[Site] = set()
    for fn in functions:
        seen: set[str] = set()
        stack = list(fn.offsets)
        while stack:
            value = stack.pop()
            op = fn.ops.get(value)
            if value in seen or op is None:
                continue
            seen.add(value)
            if op.int32 and fn.grows.get(value, False):
                where = _resolve(op.loc, locs)
                if where is not None:
                    sites.add(Site(*where))
            if op.name not in _DATA:  # a loaded value is data: its own address is another offset
                stack.extend(op.deps)
    return sorted(sites, key=lambda s: (s.file, s.line))
