"""No traceback reaches a user from a command: every bad value or path is answered in one line that
names it, before any work starts, with exit status 2; under ``--json`` the answer is JSON.

One table of bad command lines, every command in it; each runs as given and again with ``--json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from python_native.__main__ import main
from python_native.tools.commands import cli

ROOT = Path(__file__).resolve().parent.parent
MISSING = "/nonexistent-python-native-folder"

# (command line, what the one line must name). {tmp} is a fresh folder, {file} a file in it.
CASES = [
    (["bogus"], "'bogus'"),
    (["status", "--bogus"], "--bogus"),
    (["demo", "--repeats", "0"], "--repeats 0"),
    (["demo", "--repeats", "-1"], "--repeats -1"),
    (["demo", "--dtype", "float64"], "'float64'"),
    (["demo", "--seed", "x"], "'x'"),
    (["bench", "--quick", "--op", "matmul"], "'matmul'"),
    (["bench", "--quick", "--dtype", "float64"], "'float64'"),
    (["bench", "--quick", "--op", "softmax", "--save-json", f"{MISSING}/x.json"], f"{MISSING}/x.json"),
    (["bench", "--quick", "--op", "softmax", "--save-json", "{tmp}"], "is a folder"),
    (["bench", "--quick", "--op", "softmax", "--plot", f"{MISSING}/p.png"], f"{MISSING}/p.png"),
    (["bench", "--quick", "--op", "softmax", "--plot", "{tmp}/p.txt"], "'.txt'"),
    (["bench", "--calibrate", "--allow-interpreter", "--threshold", "0"], "--threshold 0.0"),
    (["bench", "--calibrate", "--allow-interpreter", "--output", f"{MISSING}/t.json"], f"{MISSING}/t.json"),
    (["calibration", "--device", "x"], "--device"),
    (["calibration", "--op", "sofmax"], "did you mean softmax"),
    (["calibration", "--op", "softmax", "--delete-user-tables"], "--op"),
    (["precompile", "--dsl", "bogus"], "'bogus'"),
    (["precompile", "--cache-dir", "{file}/sub"], "{file}"),
    (["precompile", "--dsl", "front", "--op", "softmax"], "--dsl front"),
    (["inspect", "--op", "sofmax"], "did you mean softmax"),
    (["inspect", "--arch", "sm_75"], "'sm_75'"),
    (["inspect", "--dtype", "float64"], "'float64'"),
    (["verify", "--op", "sofmax"], "did you mean softmax"),
    (["verify", "--op", "linear_cros_entropy"], "did you mean linear_cross_entropy"),
    (["verify", "--max-samples", "-1"], "--max-samples -1"),
    (["reach", "--model", "lamma"], "'lamma'"),
    (["reach", "--script", f"{MISSING}/model.py"], f"{MISSING}/model.py"),
    (["reach", "--device", "bogus"], "'bogus'"),
]


def _commands_in(cases: list) -> set[str]:
    return {argv[0] for argv, _ in cases}


def test_the_table_covers_every_command():
    assert set(cli.COMMANDS) <= _commands_in(CASES)


def _fill(values: list[str], tmp_path: Path) -> list[str]:
    file = tmp_path / "a-file"
    file.write_text("")
    return [v.format(tmp=tmp_path, file=file) for v in values]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize(("argv", "named"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_a_bad_command_line_is_one_line_naming_the_value(argv, named, as_json, tmp_path, capsys):
    argv, named = _fill(argv, tmp_path), _fill([named], tmp_path)[0]
    try:
        code = main(argv + (["--json"] if as_json else []))
    except SystemExit as e:  # argparse's own complaints exit from the parser
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in out + err
    if as_json:
        assert err == "" and len(out.splitlines()) == 1, out + err
        answer = json.loads(out)
        assert named in answer["error"] and answer["command"] in (argv[0], None), answer
    else:
        assert out == "" and len(err.splitlines()) == 1, out + err
        assert err.startswith("python -m python_native") and named in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing was written


def test_an_unexpected_failure_is_one_line_with_its_traceback_kept(monkeypatch, capsys):
    from python_native.tools.commands import status

    def broken(args):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(status, "run", broken)
    assert main(["status"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "RuntimeError: something inside broke" in err
    kept = Path(err.split("traceback in ")[1].split(";")[0])
    try:
        assert "Traceback" in kept.read_text() and "something inside broke" in kept.read_text()
    finally:
        kept.unlink()
    assert main(["status", "--json"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert "something inside broke" in answer["error"]
    Path(answer["error"].split("traceback in ")[1].split(";")[0]).unlink()


@pytest.mark.parametrize("argv", [["bench", "--quick", "--op", "softmax", "--save-json", f"{MISSING}/x.json"],
                                  ["demo", "--repeats", "-1", "--json"]], ids=["bench-save-json", "demo-repeats-json"])
def test_a_real_process_answers_in_one_line(argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "python_native", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = (proc.stdout if "--json" in argv else proc.stderr).strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
