"""Kernel source versions: which sources a backend's override of an op runs, as one short digest.

A calibration verdict holds for the kernels it timed. A backend declares the impl of each op it
installs (``declare``, from ``register_specs``); an op's version is then a digest of its impl's
module and of every module of the same package that module imports, transitively (its kernels,
their launcher, the plans they share): a change to any of them changes the version, and a table
measured before it counts as unmeasured for that op. Overrides registered by hand are not
declared and have no version: their verdicts never go stale.

Cheap: the imports are read with a regular expression (no module is imported, no AST is built),
each file is hashed once per process (and again only when its size or mtime changes), and each
module's digest is cached. The sources of the DSL backends are a few hundred kilobytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_FROM = re.compile(r"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.MULTILINE)
DIGEST_CHARS = 16

_lock = threading.Lock()
_declared: dict[tuple[str, str], str] = {}  # (dsl, op) -> module of its impl
# path -> ((mtime_ns, size), sha256, its import statements' module names relative to its package)
_files: dict[str, tuple[tuple[int, int], str, list[str]]] = {}
_module_digests: dict[str, str | None] = {}
_where: dict[str, Path | None] = {}  # module name -> its source file (None: not a file of its package)
_UNKNOWN = object()
generation = 0  # bumped by each declaration that changes a version: caches keyed by it start over


def declare(dsl: str, ops: Iterable[tuple[str, Callable[..., Any]]]) -> None:
    """Record the impl of each ``(op, impl)`` of ``dsl``: its module's sources make the op's version."""
    global generation
    with _lock:
        changed = False
        for op, impl in ops:
            module = getattr(impl, "__module__", None)
            if isinstance(module, str) and _declared.get((dsl, op)) != module:
                _declared[(dsl, op)] = module
                changed = True
        if changed:
            generation += 1


def forget(dsl: str | None = None) -> None:
    """Drop the declarations (of ``dsl``) and the cached digests (tests, and sources edited in place)."""
    global generation
    with _lock:
        for key in [k for k in _declared if dsl is None or k[0] == dsl]:
            del _declared[key]
        _files.clear()
        _module_digests.clear()
        _where.clear()
        generation += 1


def current(dsl: str, op: str) -> str | None:
    """The version of ``dsl``'s override of ``op`` in this process; None where none was declared."""
    module = _declared.get((dsl, op))
    if module is None:
        return None
    if module not in _module_digests:
        found = _digest(module)
        with _lock:
            _module_digests[module] = found
    return _module_digests[module]


def table_entry(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """``{dsl: {op: version}}`` for the declared ``(dsl, op)`` pairs: what a table written now records."""
    out: dict[str, dict[str, str]] = {}
    for dsl, op in pairs:
        version = current(dsl, op)
        if version is not None:
            out.setdefault(dsl, {})[op] = version
    return out


def recorded(header: dict[str, Any], dsl: str, op: str) -> str | None:
    """The version a table's header records for ``dsl``'s ``op`` (None: not recorded)."""
    return ((header.get("kernels") or {}).get(dsl) or {}).get(op)


def is_stale(version: str | None, dsl: str, op: str) -> bool:
    """Whether rows timed with kernel ``version`` (None: not recorded, from before versions were
    kept) timed other kernels than this process runs for ``dsl``'s ``op`` (which has a version here)."""
    running = current(dsl, op)
    return running is not None and version != running


# ----- the digest -----


def _digest(module: str) -> str | None:
    """Digest of ``module``'s file and the files of its package it imports, transitively; None when
    the module has no source file here."""
    top = module.partition(".")[0]
    root = _package_root(top)
    start = _file_of(module, top, root) if root is not None else None
    if start is None:
        return None
    seen: dict[Path, str] = {}
    todo = [(start, module)]
    while todo:
        path, name = todo.pop()
        if path in seen:
            continue
        scanned = _scan(path)
        if scanned is None:
            continue
        seen[path], sources = scanned
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo += [(found, target) for found, target in _imports(sources, package, top, root) if found not in seen]
    h = hashlib.sha256()
    for path in sorted(seen):
        h.update(f"{path.relative_to(root).as_posix()}\0{seen[path]}\n".encode())
    return h.hexdigest()[:DIGEST_CHARS]


def _package_root(top: str) -> Path | None:
    """The folder of the top-level package ``top`` (imported already: it holds a declared impl)."""
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None)
    if not path or os.path.basename(path) != "__init__.py":
        return None
    return Path(path).resolve().parent


def _file_of(name: str, top: str, root: Path) -> Path | None:
    """The source file of module ``name`` inside ``top``'s folder, without importing anything (cached)."""
    hit = _where.get(name, _UNKNOWN)
    if hit is _UNKNOWN:
        base = os.path.join(str(root), *name.split(".")[1:])
        hit = None
        for candidate in (base + ".py" if name != top else None, os.path.join(base, "__init__.py")):
            if candidate is not None and os.path.isfile(candidate):
                hit = Path(candidate)
                break
        _where[name] = hit
    return hit


def _imports(sources: list[str], package: str, top: str, root: Path) -> list[tuple[Path, str]]:
    """The files of ``top`` that import statements bring in, with their module names (``package``
    resolves relative ones). ``from pkg import mod`` brings in ``mod`` alone: a package's
    ``__init__`` gathers its modules and is no op's source; ``from mod import name``, ``mod``."""
    out = []
    for source in sources:
        name, _, names = source.partition(" ")
        base = _absolute(name, package)
        if base is None or base.partition(".")[0] != top:
            continue
        subs = [(f, f"{base}.{word}") for word in names.split()
                if (f := _file_of(f"{base}.{word}", top, root)) is not None]
        own = None if subs and not base.count(".") == 0 and _is_package(base, top, root) else _file_of(base, top, root)
        out += subs + ([(own, base)] if own is not None else [])
    return out


def _is_package(name: str, top: str, root: Path) -> bool:
    found = _file_of(name, top, root)
    return found is not None and found.name == "__init__.py"


def _statements(text: str) -> list[str]:
    """``"module name1 name2"`` per import statement of ``text`` (names: what a ``from`` imports)."""
    out = [name for group in _IMPORT.findall(text) for name in (n.strip() for n in group.split(",")) if name]
    for source, names in _FROM.findall(text):
        words = [item.strip().split(" ")[0] for item in names.strip("()").replace("\n", " ").split(",")]
        out.append(" ".join([source, *(w for w in words if w.isidentifier())]))
    return out


def _absolute(source: str, package: str) -> str | None:
    dots = len(source) - len(source.lstrip("."))
    if not dots:
        return source
    parts = package.split(".")
    if dots - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (dots - 1)])
    rest = source[dots:]
    return f"{base}.{rest}" if rest else base


def _scan(path: Path) -> tuple[str, list[str]] | None:
    """``(sha256, import statements)`` of a source file, read once while its size and mtime hold."""
    key = str(path)
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        hit = _files.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1], hit[2]
        data = path.read_bytes()
    except OSError:
        return None
    found = (stamp, hashlib.sha256(data).hexdigest(), _statements(data.decode("utf-8", errors="replace")))
    _files[key] = found
    return found[1], found[2]
