"""The architecture holds: layers import only downwards, no import cycle, small rooms, a true map.

``lint-imports`` checks the layers contracts in pyproject.toml (imports inside functions count);
a second run over a copy of the package with one upward import added proves the contract bites.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"python_native": ROOT / "python_native", "python_native_dsls": ROOT / "dsls"}
MAX_LINES = 400  # per module
MAX_FUNCTION_LINES = 60
UPPER_LAYERS = ("features", "ops", "panel", "tools", "__main__")

grimp = pytest.importorskip("grimp", reason="import-linter not installed (pip install -e '.[test]')")


def _lint_imports(tree: Path = ROOT) -> subprocess.CompletedProcess:
    """``lint-imports`` over the packages found first from ``tree`` (it puts its working folder first)."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([exe, str(ROOT / "pyproject.toml"), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)


def test_layers_contracts_hold():
    proc = _lint_imports()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "broken" in proc.stdout and " 0 broken" in proc.stdout


def test_an_upward_import_breaks_the_contract_and_names_the_line(tmp_path: Path):
    """A copy of both packages where the dispatch core imports the report tool inside a function."""
    for name, folder in PACKAGES.items():
        shutil.copytree(folder, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    slots = tmp_path / "python_native" / "core" / "slots.py"
    text = slots.read_text()
    slots.write_text(text + "\n\ndef _peek():\n    from python_native.tools import report\n\n    return report\n")
    line = text.count("\n") + 4
    proc = _lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert "python_native.core.slots -> python_native.tools.report" in proc.stdout, proc.stdout[-4000:]
    assert f"l.{line}" in proc.stdout, proc.stdout[-4000:]


def _graph():
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_anywhere():
    assert _cycles(_graph()) == []


def test_the_dispatch_core_imports_no_feature_and_no_tool():
    graph = _graph()
    for upper in UPPER_LAYERS:
        chain = graph.find_shortest_chain(importer="python_native.core", imported=f"python_native.{upper}",
                                          as_packages=True)
        assert chain is None, chain


def test_no_module_passes_400_lines():
    long = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            lines = path.read_text().count("\n")
            if lines > MAX_LINES:
                long[str(path.relative_to(ROOT))] = lines
    assert long == {}


def test_no_function_passes_60_lines():
    long = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = length
    assert long == {}


def _rooms() -> list[str]:
    """Every room the architecture page must name: each module (and C++ source) of python_native but
    the layers' own ``__init__``; in the backends, each module outside the per-family folders
    (``ops/``, ``kernels/``, ``plans/``, named as folders), and those folders."""
    rooms = []
    layers = {p for p in (ROOT / "python_native").iterdir() if p.is_dir()}
    for path in sorted((ROOT / "python_native").rglob("*")):
        if path.suffix not in (".py", ".cpp", ".h") or "__pycache__" in path.parts:
            continue
        if path.name == "__init__.py" and (path.parent in layers or path.parent == ROOT / "python_native"):
            continue
        if path.name == "__main__.py":
            continue
        rooms.append(str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "dsls").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if "__pycache__" in rel.parts or rel == Path("dsls/__init__.py"):
            continue
        if len(rel.parts) > 3 and rel.parts[2] in ("ops", "kernels", "plans"):
            rooms.append(str(Path(*rel.parts[:3])) + "/")
        elif not (rel.name == "__init__.py" and len(rel.parts) > 3):
            rooms.append(str(rel))
    return sorted(set(rooms))


def test_every_room_is_on_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:python_native|dsls)/[\w/.-]*)`", page))
    missing = [room for room in _rooms() if room not in named]
    assert missing == [], f"add one line per room to docs/architecture.md: {missing}"


def test_the_architecture_page_names_files_that_exist():
    page = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`((?:python_native|dsls|tests|benchmarks)/[\w/.-]*)`", page))
    assert len(paths) >= 20, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "architecture.md" in nav
