"""The documentation stays true: every ```python example runs alone, with and without Triton's
interpreter; the README's op list is the libraries' own; links land on real headings; the logging
example is what the package logs; ``mkdocs build --strict`` passes and fails on a broken anchor.

Each example runs by itself in a fresh process state (a fork of one interpreter that has imported
torch and the package), so it must carry its own imports and definitions. An example that needs the
Triton kernels to run says so, naming ``PYTHON_NATIVE_TRITON_INTERPRET=1`` in a comment: under the
interpreter a Triton override must see a call in it (run it, or pass it over and say why), without
the interpreter it must still run. One that does not say so must run no Triton override. A fence whose info string is ``python notest`` is skipped; keep
those rare and say why next to them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from python_native.tools.commands import names

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README = ROOT / "README.md"
SWITCHES = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")
# The checkout under test comes first on the path, whichever copy the environment has installed.
BASE = {**{k: v for k, v in os.environ.items() if k not in SWITCHES},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
ENV = {**BASE, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
NEEDS_INTERPRETER = "PYTHON_NATIVE_TRITON_INTERPRET=1"

# Runs each example in a fork of one process that has imported torch and the package: fresh globals,
# and no registration or switch of one example seen by the next. One thread: the forks use no pool
# their parent started.
HARNESS = r"""
import json, linecache, os, signal, sys, traceback, warnings
import torch
torch.set_num_threads(1)
import python_native as pn

results = []
for name, code in json.load(open(sys.argv[1])):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        signal.alarm(600)
        result = {"name": name, "ok": False, "ran": False, "seen": False, "error": None}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outer = pn.trace()
            # its source readable, as a script's is (pn.patch reads the forwards it would replace)
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            with outer:
                exec(compile(code, name, "exec"), {"__name__": "__main__"})
            # "ran": a Triton override ran; "seen": one ran or was passed over (the reason names it).
            result.update(ok=True, ran=any(e.dsl == "triton" for e in outer.events),
                          seen=any(e.dsl == "triton" or "triton:" in (e.reason or "") for e in outer.events))
        except BaseException:
            result["error"] = traceback.format_exc()[-3000:]
        with os.fdopen(write, "w") as f:
            json.dump(result, f)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    results.append(json.loads(data) if data else {"name": name, "ok": False, "error": "the fork died"})
print("RESULTS " + json.dumps(results))
"""


def examples(page: Path) -> list[str]:
    """The page's runnable ```python blocks, in order."""
    return [body for info, body in FENCE.findall(page.read_text()) if info.split() == ["python"]]


def _named_examples() -> list[tuple[str, str]]:
    return [(f"{page.name} example {i}", body) for page in [README, *PAGES] for i, body in enumerate(examples(page), 1)]


def _run_all(interpreter: bool, tmp: str) -> dict[str, dict]:
    blocks = Path(tmp) / f"examples-{interpreter}.json"
    blocks.write_text(json.dumps(_named_examples()))
    proc = subprocess.run([sys.executable, "-c", HARNESS, str(blocks)], env=ENV if interpreter else BASE,
                          cwd=tmp, capture_output=True, text=True, timeout=3000)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {r["name"]: r for r in json.loads(line.removeprefix("RESULTS "))}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[bool, dict[str, dict]]:
    tmp = str(tmp_path_factory.mktemp("examples"))
    return {mode: _run_all(mode, tmp) for mode in (True, False)}


def test_fences_parse():
    blocks = {page.name: examples(page) for page in PAGES}
    assert blocks["user-guide.md"] and blocks["dsl-authors.md"] and blocks["runtime-wrappers.md"] and examples(README)


@pytest.mark.slow
@pytest.mark.parametrize("page", [README, *[p for p in PAGES if examples(p)]], ids=lambda p: p.name)
def test_every_example_runs_alone_with_and_without_the_interpreter(page: Path, results):
    for name, code in _named_examples():
        if not name.startswith(f"{page.name} "):
            continue
        for interpreter in (True, False):
            r = results[interpreter][name]
            mode = "with" if interpreter else "without"
            assert r["ok"], f"{name} failed {mode} the interpreter:\n{r['error']}"
        r = results[True][name]
        if NEEDS_INTERPRETER in code:
            assert r["seen"], f"{name} says it needs the Triton kernels, yet no Triton override saw a call in it"
        else:
            assert not r["ran"], f"{name} runs Triton overrides: say so ({NEEDS_INTERPRETER}) in the example"


PRINTS = re.compile(r"^```python\n((?:(?!```).)*)^```\s*\n\nprints[^\n]*\n\n```text\n((?:(?!```).)*)^```", re.S | re.M)


def _printing_examples() -> list[tuple[str, str, str]]:
    """``(name, code, shown)`` for every example a page follows with "prints" and the output it shows."""
    found = []
    for page in [README, *PAGES]:
        for i, (code, shown) in enumerate(PRINTS.findall(page.read_text()), 1):
            found.append((f"{page.name} printing example {i}", code, shown))
    return found


# An override's number (``mydsl::add.Tensor#65``, ``_pn_cond_65`` in its router) counts the overrides the
# process registered before it: more where the Triton kernels install at the CUDA key as well.
_COUNTER = re.compile(r"(::[\w.]+#|\b_pn_[a-z]+_)(\d+)\b")


def _renumbered(lines: list[str]) -> list[str]:
    """``lines`` with the override numbers renumbered 1, 2, ... in the order they first appear: a
    listing then shows which overrides are the same and which differ, whatever came before."""
    order: dict[str, str] = {}
    return [_COUNTER.sub(lambda m: m[1] + order.setdefault(m[2], str(len(order) + 1)), line) for line in lines]


def test_override_numbers_are_compared_by_their_order_of_appearance():
    got = _renumbered(["mydsl::add.Tensor#65", "    if _pn_cond_65(self):", "mydsl::add_.Tensor#66 _pn_impl_66",
                       "_pn_default_alpha # 7"])
    assert got == ["mydsl::add.Tensor#1", "    if _pn_cond_1(self):", "mydsl::add_.Tensor#2 _pn_impl_2",
                   "_pn_default_alpha # 7"]


@pytest.mark.parametrize(("name", "code", "shown"), _printing_examples(), ids=lambda v: v if " example " in str(v) else "")
def test_printed_output_is_what_the_page_shows(name: str, code: str, shown: str, tmp_path: Path):
    """A listing a page says an example prints (a router's source, a trace table, a patch report) is
    that example's output, run alone in a fresh process (under the interpreter where it needs it)."""
    env = ENV if NEEDS_INTERPRETER in code else BASE
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _renumbered([line.rstrip() for line in proc.stdout.strip("\n").splitlines()])
    assert lines == _renumbered([line.rstrip() for line in shown.strip("\n").splitlines()]), f"{name} prints:\n{proc.stdout}"


def _offers_row() -> str:
    return next(line for line in README.read_text().splitlines() if line.startswith("| Overrides of aten ops |"))


def test_readme_lists_every_op_each_library_overrides():
    row = _offers_row()
    for dsl, label in (("triton", "Triton"), ("cutedsl", "CuTe DSL")):
        match = re.search(rf"{label} \((\d+)[^)]*\): (.*?)\.(?: |$)", row)
        assert match, f"the README's op list has no '{label} (N...): ...' part"
        listed = re.findall(r"`([^`]+)`", match.group(2))
        assert sorted(listed) == names.library_names(dsl) and int(match.group(1)) == len(listed), (dsl, listed)
    fused = next(line for line in README.read_text().splitlines() if line.startswith("| Fused ops outside aten |"))
    assert all(f"`torch.ops.python_native.{name}`" in fused for name in names.library_names("triton", "python_native"))


def test_ci_runs_the_readmes_test_command_then_the_slow_tests():
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    main, tests = [body.strip() for info, body in FENCE.findall(setup) if info.strip() == "bash"]
    assert main.endswith("python -m python_native") and '-m "not slow"' in tests
    steps = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert steps[:2] == [tests, 'python -m pytest -q -m slow']
    # then the edge values under aten's other CPU capabilities, as the README says
    capabilities, overrides_off = steps[2:-1], steps[-1]
    assert all("ATEN_CPU_CAPABILITY=" in step and "test_edge_grid.py" in step for step in capabilities) and capabilities
    assert "ATEN_CPU_CAPABILITY=default" in setup and "avx2" in setup
    # then, every override off, the Triton tests: those that claim an override ran must fail
    assert overrides_off == 'PYTHON_NATIVE_DISABLE=1 python -m pytest -q tests/triton -m "not slow" --overrides-off'
    assert f"`{overrides_off}`" in " ".join(setup.split())


def test_the_logging_example_is_what_registration_logs(tmp_path: Path):
    page = (DOCS / "user-guide.md").read_text()
    block = next(body for info, body in FENCE.findall(page) if info.strip() == "text" and "installed" in body)
    shown = [line.split("] ", 1)[1] for line in block.splitlines() if line.startswith("I")]
    proc = subprocess.run([sys.executable, "-c", "import torch, python_native"], env={**ENV, "TORCH_LOGS": "python_native"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    logged = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if "] python_native: " in line]
    assert shown and all(line in logged for line in shown), (shown, logged)


def _github_slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _mkdocs_slug(heading: str) -> str:
    from markdown.extensions.toc import slugify

    return slugify(heading.replace("`", ""), "-")


def _links() -> list[tuple[Path, Path, str]]:
    """(page, target page, anchor) of every link with an anchor in the README and the docs."""
    found = []
    for page in [README, *PAGES]:
        for target, anchor in re.findall(r"\]\(([\w./-]*?\.md)?#([^)\s]+)\)", page.read_text()):
            found.append((page, (page.parent / target).resolve() if target else page, anchor))
    return found


def test_anchors_land_on_headings_on_github_and_on_the_site():
    pytest.importorskip("markdown", reason="markdown not installed (pip install -e '.[docs]')")
    links = _links()
    assert any(page == README for page, _, _ in links)
    for page, target, anchor in links:
        headings = re.findall(r"^#+ (.+)$", FENCE.sub("", target.read_text()), re.M)
        if anchor.startswith("python_native."):  # an API object mkdocstrings renders, not a heading
            continue
        assert anchor in {_github_slug(h) for h in headings}, f"{page.name}: #{anchor} is no heading of {target.name} on GitHub"
        if page != README:
            assert anchor in {_mkdocs_slug(h) for h in headings}, f"{page.name}: #{anchor} is no heading of {target.name} on the site"


_DISABLE_CHECK = """
import torch, python_native as pn
from python_native.panel import native_bridge
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
    proc = subprocess.run([sys.executable, "-c", _DISABLE_CHECK], env={**env, name: "1"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _mkdocs() -> str:
    pytest.importorskip("mkdocs", reason="mkdocs not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings not installed (pip install -e '.[docs]')")
    return shutil.which("mkdocs") or str(Path(sys.executable).with_name("mkdocs"))


def test_mkdocs_build_strict(tmp_path: Path):
    proc = subprocess.run([_mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "index.html").exists()


def test_a_broken_anchor_fails_the_strict_build(tmp_path: Path):
    """The site's own validation settings, on two pages where one links to a heading the other lacks."""
    import yaml

    class Loader(yaml.SafeLoader):  # the site's config names Python objects (!!python/name:...): not needed here
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    validation = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["validation"]
    assert validation["anchors"] == "warn"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [there](other.md#no-such-heading).\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A heading\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({"site_name": "t", "validation": validation}))
    proc = subprocess.run([_mkdocs(), "build", "--strict"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "no-such-heading" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
