"""The documentation runs as written: every ```python example, the documented environment switches,
and ``mkdocs build --strict``.

Each page's examples run in order in one fresh interpreter (Triton through its interpreter at the
CPU key), so a page may build on its earlier examples but never on another page's. A fence whose
info string is ``python notest`` is skipped; keep those rare and say why next to them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
# The checkout under test comes first on the path, whichever copy the environment has installed; the
# kernels run through Triton's interpreter at the CPU key, on a GPU machine too.
ENV = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == "python_native" for ep in entry_points(group="torch.backends"))


# Installed, the package mounts itself at torch.backends.python_native on ``import torch`` (its entry
# point). A bare checkout on PYTHONPATH has no entry point, so there each page's script first imports
# python_native, which mounts it the same way, before the examples run as written.
PRELUDE = "" if _entry_point_installed() else "import python_native  # in place of the torch.backends entry point\n\n"


def examples(page: Path) -> list[str]:
    """The page's runnable ```python blocks, in order."""
    return [body for info, body in FENCE.findall(page.read_text()) if info.split() == ["python"]]


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_fences_parse():
    blocks = {page.name: examples(page) for page in PAGES}
    assert blocks["user-guide.md"] and blocks["dsl-authors.md"] and blocks["runtime-wrappers.md"]


@pytest.mark.parametrize("page", [p for p in PAGES if examples(p)], ids=lambda p: p.name)
def test_page_examples_run(page: Path, tmp_path: Path):
    script = PRELUDE + "\n\n".join(f"# --- example {i} of {page.name}\n{body}" for i, body in enumerate(examples(page)))
    proc = _python(script, ENV, tmp_path)
    assert proc.returncode == 0, f"{page.name} examples failed:\n{proc.stderr[-4000:]}"


def test_readme_examples_run(tmp_path: Path):
    """The README's snippets run as written: nothing undefined, every attribute real."""
    blocks = examples(ROOT / "README.md")
    assert blocks
    proc = _python(PRELUDE + "\n\n".join(blocks), ENV, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]


_DISABLE_CHECK = """
import torch, python_native as pn
from python_native.features import native_bridge
builtin = [o for o in pn.overrides() if native_bridge.origin_of(o) is None]
assert "triton" in pn.all_dsls and builtin == [], builtin
assert not any(o.active for o in pn.overrides()), pn.overrides()
h = pn.register_op_override("triton", "aten", "neg", "CPU", lambda x: True, lambda x: x * 0)
assert h in pn.overrides() and "inactive" in repr(h)
pn.triton.enable(); pn.enable_operations("neg")
with pn.trace() as t:
    y = torch.neg(torch.ones(2))
assert y.tolist() == [-1.0, -1.0] and t.ops("override") == [], t.events
"""


@pytest.mark.parametrize("name", ["PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT"])
def test_disable_switch_does_what_the_user_guide_says(name: str, tmp_path: Path):
    row = next(line for line in (DOCS / "user-guide.md").read_text().splitlines() if "PYTHON_NATIVE_DISABLE=1" in line)
    assert name in row and "install no overrides" in row and "listed as inactive" in row
    env = {k: v for k, v in ENV.items() if k not in ("PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT")}
    proc = _python(_DISABLE_CHECK, {**env, name: "1"}, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_mkdocs_build_strict(tmp_path: Path):
    pytest.importorskip("mkdocs", reason="mkdocs not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings not installed (pip install -e '.[docs]')")
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).with_name("mkdocs"))
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "index.html").exists()
