"""Calibrate once, in force after: the user's tables in the cache dir, written atomically, read by
many processes at once, corrupt or foreign files skipped and named, version drift said once."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
from calibration_testing import running, table

import python_native_dsls.triton as backend
from python_native.features import calibration
from python_native.features.calibration import sources, store
from python_native.tools.bench.progress import Progress

needs_triton = pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
ON_GPU = backend.device_type() == "cuda"


def _env(cache_home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "PYTHON_NATIVE_TRITON_INTERPRET": "1",
           "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", **extra}
    env.pop(calibration.ENV_VAR, None)
    return env


def _run(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@needs_triton
@pytest.mark.skipif(ON_GPU, reason="measures the interpreter's CPU device (on a GPU it would calibrate the GPU)")
def test_calibrate_writes_the_users_table_and_a_fresh_status_reports_it_in_force(tmp_path):
    """The command of issue 22's "Done when", end to end in fresh processes."""
    env = _env(tmp_path)
    # One op and dtype: every step below is the same for a table of any size (the interpreter takes
    # minutes per op); tests/test_bench.py calibrates the other ops.
    out = _run(["-m", "python_native", "bench", "--calibrate", "--allow-interpreter", "--quick", "--op", "softmax",
                "--dtype", "float32"], env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    [written] = (tmp_path / "python-native" / "calibration").glob("*.json")
    assert written.name.startswith("cpu-torch") and str(written) in out.stdout
    assert "calibrated in" in out.stdout and "in force from now on" in out.stdout
    progress = [line for line in out.stderr.splitlines() if line.startswith("[")]
    assert progress and all(", eta " in line for line in progress)  # plain lines: stderr is no terminal
    total = int(progress[-1].split("/")[1].split(",")[0])
    assert len(progress) == total

    status = _run(["-m", "python_native", "status", "--json"], env)
    assert status.returncode == 0, status.stderr[-3000:]
    info = json.loads(status.stdout)["calibration"]
    assert info["in_force"] == str(written) and info["device"] == "cpu"
    [device] = info["devices"]
    [in_force] = [g for g in device["gated_by"] if g["kind"] == "table"]
    assert in_force["origin"] == "user" and in_force["path"] == str(written)
    assert in_force["versions"] == sources.table_versions(json.loads(written.read_text())) and not in_force["drift"]
    assert in_force["versions"]["torch"] == sources.major_minor(json.loads(status.stdout)["torch"])

    listed = _run(["-m", "python_native", "calibration"], env)
    assert listed.returncode == 0 and f"in force here: {written}" in listed.stdout
    deleted = _run(["-m", "python_native", "calibration", "--delete-user-tables"], env)
    assert deleted.returncode == 0 and f"deleted {written}" in deleted.stdout and not written.exists()


def test_calibrate_fails_fast_where_the_cache_cannot_be_written(tmp_path, capsys, monkeypatch):
    import torch

    from python_native.__main__ import main

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the command's choice for its run

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    args = ["bench", "--calibrate", "--allow-interpreter", "--quick"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(blocker) in err and "--output" in err


def test_progress_plain_lines_say_count_and_eta_and_the_bar_runs(monkeypatch):
    stream = io.StringIO()
    bar = Progress(3, "calibrating", stream)  # StringIO is no terminal: plain lines
    for text in ("a", "b", "c"):
        bar.step(text)
    assert bar.close() >= 0
    lines = stream.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == ["[1/3, eta 0:00", "[2/3, eta 0:00", "[3/3, eta 0:00"]
    assert [line.split("] ")[1] for line in lines] == ["a", "b", "c"]
    pytest.importorskip("rich")
    stream = io.StringIO()
    bar = Progress(2, "calibrating", stream, bar=True)
    bar.step("one")
    bar.step("two")
    bar.close()
    assert "calibrating" in stream.getvalue() and "2/2" in stream.getvalue() and "one" in stream.getvalue()


def test_quiet_progress_counts_steps_and_prints_none():
    stream = io.StringIO()
    with Progress(2, "precompile sm_90a", stream, quiet=True) as bar:
        bar.step("kernel one")
        bar.step("kernel two")
    assert bar.done == 2 and stream.getvalue() == ""


def test_corrupt_and_foreign_files_in_the_cache_are_skipped_and_named(calib):
    folder = calib.user_dir
    folder.mkdir(parents=True)
    good = calib.user(table("cpu"))
    bad = {
        "cpu-torch2.13-truncated.json": '{"format": 1, "device": "cpu", "rows": [',
        "cpu-list.json": "[]",
        "cpu-null.json": "null",
        "cpu-deep.json": "[" * 100_000 + "]" * 100_000,
        "cpu-binary.json": b"\x00\xff\xfe garbage",
        "cpu-wins-string.json": json.dumps(table("cpu", [{"op": "_softmax", "dtype": "float32", "bucket": 9,
                                                          "wins": "false"}])),
        "cpu-foreign.json": json.dumps(table("Other GPU/sm80")),  # named for cpu, measured elsewhere
    }
    for name, content in bad.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (folder / ".cpu-torch2.13.json.1234.tmp").write_text("{")  # a writer's temporary file: not a table
    calibration.reset()
    calib.device("cpu")
    assert calibration.wins("_softmax", "float32", 9, "cpu") is True  # the good table gates
    info = calibration.describe()
    assert info["in_force"] == str(good)
    skipped = {Path(s["path"]).name: s for s in info["skipped"]}
    assert set(skipped) == set(bad)
    assert "not valid JSON" in skipped["cpu-torch2.13-truncated.json"]["reason"]
    assert "a JSON object is needed, got a JSON array" in skipped["cpu-list.json"]["reason"]
    assert "got null" in skipped["cpu-null.json"]["reason"]
    assert "nested too deeply" in skipped["cpu-deep.json"]["reason"]
    assert "not valid JSON" in skipped["cpu-binary.json"]["reason"]
    assert "'wins' must be true or false" in skipped["cpu-wins-string.json"]["reason"]
    assert "its device is 'Other GPU/sm80'" in skipped["cpu-foreign.json"]["reason"]
    assert all("--delete-user-tables" in s["fix"] or "rename" in s["fix"] for s in skipped.values())
    from python_native.tools import report

    text = "\n".join(report.calibration_lines(info))
    assert "skipped" in text and "cpu-list.json" in text and "fix:" in text


@needs_triton
def test_a_corrupt_cache_never_fails_import_torch(tmp_path):
    folder = tmp_path / "python-native" / "calibration"
    folder.mkdir(parents=True)
    (folder / "cpu.json").write_text("[]")
    (folder / "cpu-x.json").write_text("{" * 50_000)
    script = "import torch, json, python_native as pn; s = pn.status(); print(len(s['overrides'])); " \
             "print(json.dumps(s['calibration']['skipped']))"
    out = _run(["-c", script], _env(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    count, skipped = out.stdout.splitlines()
    clean = _run(["-c", "import torch, python_native as pn; print(len(pn.status()['overrides']))"],
                 _env(tmp_path / "empty"))
    assert count == clean.stdout.strip() and int(count) > 0  # every override installed, as without the files
    assert {Path(s["path"]).name for s in json.loads(skipped)} == {"cpu.json", "cpu-x.json"}


def _reader(seconds: float, results) -> None:
    """One rank: start over and read the cache (list, parse, resolve, describe) until ``seconds`` pass."""
    import time

    deadline, reads = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < deadline or reads < 5:
            calibration.reset()
            info = calibration.describe()
            assert not info["skipped"] and "error" not in info, info["skipped"]
            [found] = [t for t in info["tables"] if t["device"] == "cpu"]  # the one table, read whole
            assert found["origin"] == "user" and found["rows"] and found["path"].endswith(".json"), found
            if info["device"] == "cpu":  # under the interpreter this very process runs on it: in force here
                assert info["in_force"] == found["path"], info["in_force"]
            assert calibration.wins("_softmax", "float32", 9, "cpu") is not None  # and it gates the device
            reads += 1
        results.put(("read", reads))
    except BaseException as e:  # reported to the test, which fails with it
        results.put(("error", f"{type(e).__name__}: {e}"))


def _writer(seconds: float, content: dict, results) -> None:
    """One calibration run after another, each writing a table of another size."""
    import time

    deadline, writes = time.monotonic() + seconds, 0
    try:
        while writes == 0 or time.monotonic() < deadline:
            content["rows"][0]["wins"] = not content["rows"][0]["wins"]
            content["rows"] = (content["rows"] * 2)[: 1 + 37 * (writes % 11)]
            store.save(content)
            writes += 1
        results.put(("write", writes))
    except BaseException as e:
        results.put(("error", f"{type(e).__name__}: {e}"))


def test_eight_readers_and_two_writers_at_once(calib):
    """Eight ranks read the cache at once while two calibration runs rewrite the table: no reader
    ever sees a half-written or missing table, nothing raises, no temporary file is left."""
    import multiprocessing

    content = table("cpu")
    calib.device("cpu")
    store.save(content)  # one table in place before the ranks start
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(2.0, results)) for _ in range(8)]
    procs += [ctx.Process(target=_writer, args=(3.0, dict(content), results)) for _ in range(2)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [r for r in reports if r[0] == "error"] == []
    assert sorted(kind for kind, _ in reports) == ["read"] * 8 + ["write"] * 2
    assert all(p.exitcode == 0 for p in procs)
    assert sum(n for kind, n in reports if kind == "write") > 10
    folder = calib.user_dir
    assert [p.name for p in folder.glob("*.json")] == [sources.user_table_filename("cpu", sources.table_versions(content))]
    assert not list(folder.glob("*.tmp"))  # every temporary file renamed or removed
    calibration.tables.load(next(folder.glob("*.json")))


def test_of_two_tables_for_one_device_the_running_versions_win_and_drift_still_gates(calib):
    key = "cpu"
    calib.device(key)
    old = table(key, [{"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": False}], torch="1.0.0",
                date="2030-01-01T00:00:00Z")  # newer, but measured with another torch
    drifted = calib.user(old)
    assert calibration.wins("_softmax", "float32", 9, key) is False  # alone, the drifted table still gates
    [device] = calibration.describe()["devices"]
    assert device["gated_by"][0]["drift"] == [f"torch 1.0 (running {sources.major_minor(running()['torch'])})"]
    current = calib.user(table(key, [{"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": True}]))
    assert calibration.wins("_softmax", "float32", 9, key) is True
    uses = {t["path"]: t["use"] for t in calibration.describe()["tables"]}
    assert uses[str(current)] == "in force for cpu" and uses[str(drifted)].startswith(f"shadowed by {current}")
    current.unlink()
    shipped = calib.ship(table(key, [{"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": True}]))
    assert calibration.describe()["in_force"] == str(shipped)  # running versions first, then the tier


@needs_triton
def test_drift_is_said_once_per_process_with_the_command_to_recalibrate(tmp_path):
    content = table("cpu", [{"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": True}], torch="1.0.0")
    folder = tmp_path / "python-native" / "calibration"
    folder.mkdir(parents=True)
    (folder / "cpu-torch1.0.json").write_text(json.dumps(content))
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        import torch, python_native as pn
        from python_native.features import calibration
        from python_native.tools import report
        for _ in range(3):
            calibration.reset()
            pn.status()
            calibration.wins("_softmax", "float32", 9)
        print(report.render(pn.status()))
    """)
    out = _run(["-c", script], _env(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("CalibrationDriftWarning") == 1, out.stderr[-3000:]
    assert "python -m python_native bench --calibrate" in out.stderr
    assert "measured with torch 1.0 (running" in out.stdout and "recalibrate" in out.stdout


def test_calibration_command_lists_and_deletes_the_users_tables(calib, capsys):
    from python_native.__main__ import main

    calib.device("cpu")
    mine = calib.user(table("cpu"))
    other = calib.user(table("Other GPU/sm80"))
    assert main(["calibration", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {t["path"]: t["use"] for t in info["tables"]} == {str(mine): "in force for cpu",
                                                            str(other): "for a device not seen here"}
    assert main(["calibration"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Calibration") and f"in force here: {mine}" in text
    assert main(["calibration", "--device", "cpu"]) == 2  # --device only narrows a deletion
    capsys.readouterr()
    assert main(["calibration", "--delete-user-tables", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == f"deleted {mine}"
    assert not mine.exists() and other.exists() and calibration.describe()["in_force"] is None
    assert main(["calibration", "--delete-user-tables"]) == 0
    assert not other.exists()
