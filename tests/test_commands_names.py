"""One naming scheme in every command: public names (``softmax``) and aten names (``_softmax``,
``sum``) by the panel's rule, in repeated ``--op`` options and comma lists alike, and ``--cache-dir``
honoured by every builder ``precompile`` runs."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import python_native as pn
from conftest import compiled_front_problem
from python_native.__main__ import main
from python_native.tools import bench
from python_native.tools.commands import cli, names

ROOT = Path(__file__).resolve().parent.parent
OP_COMMANDS = ("bench", "calibration", "inspect", "precompile", "verify")


def _option(command: str, flag: str) -> argparse.Action:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return next(a for a in sub._actions if flag in a.option_strings)


@pytest.mark.parametrize("command", OP_COMMANDS)
def test_every_command_takes_repeated_op_options_and_comma_lists(command):
    action = _option(command, "--op")
    assert isinstance(action, argparse._AppendAction) and "--ops" in action.option_strings
    parsed = cli.parser().parse_args([command, "--op", "softmax,layer_norm", "--ops", "gelu"])
    assert names.listed(getattr(parsed, action.dest)) == ["softmax", "layer_norm", "gelu"]


def test_listed_flattens_repeats_and_commas_once_each():
    assert names.listed(["a,b", " a ", "c,,", "b"]) == ["a", "b", "c"]
    assert names.listed(None) == [] and names.listed("x, y") == ["x", "y"]


def test_public_aten_and_bare_names_select_the_same_benchmark_rows():
    rows = names.for_rows("--op", bench.OPS)
    assert rows.resolve("softmax") == rows.resolve("_softmax") == ["softmax"]
    assert rows.resolve(["bmm", "layer_norm,native_layer_norm"]) == ["bmm_outer", "layer_norm"]
    assert rows.resolve("gelu_backward") == ["gelu", "gelu_tanh"]  # both rows reach it
    assert rows.resolve("sum") == ["sum"] and rows.resolve("sum.dim_IntList") == ["sum", "sum_dim0"]
    assert rows.resolve("max") == ["max_dim"] and rows.resolve(None) is None


def test_a_forward_covers_its_backward_a_backward_only_itself():
    ops = [o.op for o in pn.overrides() if o.derived_from is None]
    if "_softmax" not in ops:
        pytest.skip("no softmax override installed here")
    choice = names.for_ops("--op", ops, "installed override")
    assert choice.resolve("softmax") == choice.resolve("_softmax") == ["_softmax", "_softmax_backward_data"]
    assert choice.resolve("_softmax_backward_data") == ["_softmax_backward_data"]


def test_a_name_known_but_not_here_is_told_apart_from_a_typo():
    choice = names.for_ops("--op", ["_softmax", "_softmax_backward_data"], "CuTe DSL specialization")
    with pytest.raises(names.UsageError, match=r"--op 'bmm': no CuTe DSL specialization covers it; allowed: softmax$"):
        choice.resolve("bmm")
    with pytest.raises(names.UsageError, match=r"'sofmax' unknown .* did you mean softmax"):
        choice.resolve(["softmax", "sofmax"])


def test_calibration_shows_only_the_ops_named(calib, capsys):
    from calibration_testing import table

    calib.device("cpu")
    calib.user(table("cpu"))
    assert main(["calibration", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert {"_softmax", "silu"} <= set(every["devices"][0]["thresholds"]["triton"])
    assert main(["calibration", "--op", "softmax", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ops"] == ["_softmax", "_softmax_backward_data"]
    assert list(info["devices"][0]["thresholds"]["triton"]) == ["_softmax"]
    assert main(["calibration", "--op", "softmax"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Calibration") and "_softmax" in text and " silu " not in text


def test_precompile_front_honours_cache_dir(tmp_path):
    """The compiled front found in ``--cache-dir DIR`` (DIR/front), not in the default cache."""
    if compiled_front_problem() is not None:
        pytest.skip(compiled_front_problem())
    from python_native.features.front import build
    from python_native.foundations import trust

    built = build.build()[1]  # the default cache's library (compiled once if missing)
    (tmp_path / "front").mkdir()
    for path in (built, trust.manifest_path(built)):  # as a build into DIR leaves it (library and manifest)
        shutil.copy(path, tmp_path / "front" / path.name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHON_NATIVE_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "python_native", "precompile", "--dsl", "front", "--cache-dir",
                           str(tmp_path), "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    front = json.loads(proc.stdout)["front"]
    assert front["cached"] and front["library"] == str(tmp_path / "front" / built.name)
