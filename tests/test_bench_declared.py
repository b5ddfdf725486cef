"""``bench``'s rows come from the op declarations (``Op.bench_rows``), and from nowhere else.

A row the tool names must be declared with an op, every declared row must be measured, and the
tool's modules name no row of their own: a new op brings its rows, and no table there must learn it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
import python_native_dsls.triton as backend
from python_native.tools.bench import rows
from python_native_dsls.catalogue import built_ops

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "python_native" / "tools" / "bench"
DTYPES = [torch.bfloat16, torch.float32]


def _declared() -> dict[str, str]:
    """Every declared row, by name: the op declaring it first (its ``lib``)."""
    found: dict[str, str] = {}
    for built in built_ops():
        for row in built.op.bench_rows:
            found.setdefault(row.name, built.op.lib)
    return found


def test_every_row_bench_knows_is_declared_and_every_declared_row_is_measured():
    declared = _declared()
    assert list(rows.OPS) == list(declared)
    reached = {name for built in built_ops() for name in built.op.bench}
    assert reached == set(declared), reached ^ set(declared)  # no op names a row nobody declares
    for quick in (True, False):
        measured = [c.op for c in rows.cases(DTYPES, quick)]
        assert set(measured) == set(declared), (quick, set(declared) - set(measured))
    # Both backends override softmax: its row is declared by each, measured once.
    softmax = [c for c in rows.cases([torch.float32], quick=True) if c.op == "softmax"]
    assert len(softmax) == len(set(softmax)) == 4


def test_the_tool_names_no_row_of_its_own():
    """No op table in the bench tool: it names no row (a row's FLOPs are declared with it too)."""
    names = set(_declared())
    for path in (BENCH / "rows.py", BENCH / "measure.py", BENCH / "output.py"):
        tree = ast.parse(path.read_text())
        named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}
        assert not named, (path.name, named)


def test_a_row_is_its_declaration():
    """Inputs, call and bytes of a case are its declared row's."""
    declared = rows.DECLARED["topk"]
    case = rows.Case("topk", "fwd", declared.quick[0], torch.float32)
    inputs = rows.make_inputs(case, "cpu")
    assert inputs.k == declared.quick[0][2] and inputs.x.shape == declared.quick[0][:2]
    assert torch.equal(rows.torch_function("topk")(inputs), torch.topk(inputs.x, inputs.k).values)
    assert rows.bytes_moved(case) == declared.bytes(case.shape, "fwd", 4)
    norm = rows.make_inputs(rows.Case("layer_norm", "fwd+bwd", (4, 64), torch.bfloat16), "cpu")
    assert norm.leaves == [norm.x, norm.w, norm.b] and norm.dy.shape == (4, 64)


@pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
def test_a_declared_aten_row_fires_through_the_command():
    row = next(name for name, lib in _declared().items() if lib == "aten")
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "python_native", "bench", "--quick", "--json", "--dtypes", "float32",
                           "--ops", row], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)["rows"]
    assert measured and {r["op"] for r in measured} == {row}
    assert all(r["fired"] for r in measured), measured
