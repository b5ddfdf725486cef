"""Kernel versions: a table's rows hold for the kernels they timed; rows of other kernels count as
unmeasured (measured again under pn.benchmark, the policy or nothing otherwise), and status says so."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from calibration_testing import FAKE_DEVICE, table
from first_use_testing import overridden, sub_of

from conftest import TEST_DSL, always, marked_sub
from python_native.features import calibration
from python_native.features.calibration import versions
from python_native.tools import report

FILES = {
    "__init__.py": "",
    "ops.py": "from .kernels import family\nfrom . import shared\n\ndef impl(x):\n    return family.run(x)\n",
    "kernels/__init__.py": "# gathers the kernels\n",
    "kernels/family.py": "from ..plans import tile\n\ndef run(x):\n    return x\n",
    "plans/__init__.py": "",
    "plans/tile.py": "TILE = 64\n",
    "shared.py": "EPS = 1e-6\n",
    "other.py": "UNUSED = 1\n",
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``kpkg`` whose ``ops.impl`` runs ``kernels/family.py``, which uses ``plans/tile.py``."""
    root = tmp_path / "kpkg"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("kpkg.ops")
    yield root, module
    versions.forget("kdsl")
    versions.forget(TEST_DSL)
    for name in [n for n in sys.modules if n == "kpkg" or n.startswith("kpkg.")]:
        del sys.modules[name]


def _version(module) -> str | None:
    versions.forget("kdsl")
    versions.declare("kdsl", [("op", module.impl)])
    return versions.current("kdsl", "op")


@pytest.mark.parametrize("edited, changes", [
    ("ops.py", True), ("kernels/family.py", True), ("plans/tile.py", True), ("shared.py", True),
    ("kernels/__init__.py", False),  # a package's __init__ gathers modules: no op's source
    ("other.py", False),  # not imported by the op
])
def test_a_version_follows_the_sources_an_op_runs(package, edited, changes):
    root, module = package
    before = _version(module)
    assert before is not None and len(before) == versions.DIGEST_CHARS
    (root / edited).write_text((root / edited).read_text() + "\n# edited\n")
    assert (_version(module) != before) is changes
    assert versions.current("kdsl", "another op") is None  # not declared: no version, never stale


def test_the_backends_families_each_have_their_own_version():
    from python_native_dsls.triton.ops import all_overrides

    found = {spec.op: versions.current("triton", spec.op) for spec in all_overrides()}
    assert all(found.values())
    assert found["_softmax"] == found["_log_softmax"] != found["native_layer_norm"] != found["amax"]


def test_rows_of_other_kernels_count_as_unmeasured_and_status_names_them(bench, package, overrides):
    _, module = package
    versions.declare(TEST_DSL, [("sub.Tensor", module.impl)])
    now = versions.current(TEST_DSL, "sub.Tensor")
    cell = {"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 9, "last_dim": 64}
    calibration.set_benchmark(False)
    bench.calib.user(table(FAKE_DEVICE, [{**cell, "wins": True}], dsls={TEST_DSL: "1.2.3"},
                           kernels={TEST_DSL: {"sub.Tensor": "0123456789abcdef"}}))
    overrides("sub.Tensor", always, marked_sub)
    assert calibration.wins("sub.Tensor", "float32", 9, FAKE_DEVICE, TEST_DSL, last_dim=64) is None  # stale
    info = calibration.describe()
    [found] = [t for t in info["tables"] if t["origin"] == "user"]
    assert found["stale"] == [f"{TEST_DSL} sub.Tensor"]
    assert f"so unmeasured): {TEST_DSL} sub.Tensor" in " ".join(" ".join(report.calibration_lines(info)).split())
    with pn.benchmark_set(True):  # unmeasured: measured again, and the new verdict records the kernels
        assert torch.equal(sub_of(torch.ones(4, 64)), overridden(torch.ones(4, 64)))
    assert bench.clock.asked == [(4, 64)]
    fresh = [r for r in bench.user_rows() if r.get("first_use")]
    assert [(r["bucket"], r["kernel"], r["wins"]) for r in fresh] == [(9, now, True)]
    calibration.reset()  # read from the table now: the first-use row of these kernels counts
    assert calibration.wins("sub.Tensor", "float32", 9, FAKE_DEVICE, TEST_DSL, last_dim=64) is True


def test_first_use_rows_of_other_kernels_are_measured_again(bench, package, overrides):
    _, module = package
    versions.declare(TEST_DSL, [("sub.Tensor", module.impl)])
    old = {"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 9, "last_dim": 64, "wins": False,
           "first_use": True, "kernel": "0123456789abcdef"}
    bench.calib.user(table(FAKE_DEVICE, [old], dsls={TEST_DSL: "1.2.3"}))
    overrides("sub.Tensor", always, marked_sub)
    assert torch.equal(sub_of(torch.ones(4, 64)), overridden(torch.ones(4, 64)))  # the old loss does not hold
    assert bench.clock.asked == [(4, 64)]
    assert sorted(r["kernel"] for r in bench.user_rows()) == sorted([old["kernel"], versions.current(TEST_DSL, "sub.Tensor")])


def test_tables_validate_the_version_fields(calib):
    good = table(FAKE_DEVICE, [{"op": "x", "dtype": "float32", "bucket": 3, "wins": True, "kernel": "ab"}],
                 kernels={"triton": {"x": "ab"}})
    calibration.validate(good)
    for bad, said in (({"kernels": {"triton": ["x"]}}, "'kernels' must be an object of DSL name"),
                      ({"rows": [{**good["rows"][0], "kernel": 3}]}, "'kernel' must be a kernel version string"),
                      ({"rows": [{**good["rows"][0], "first_use": "yes"}]}, "'first_use' must be true or false")):
        with pytest.raises(ValueError, match=said):
            calibration.validate({**good, **bad})

