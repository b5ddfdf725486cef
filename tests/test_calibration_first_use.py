"""``pn.benchmark``: an override is timed against aten on the first call of each size no table
measured, the call is answered by the winner, and the verdict is kept in the user's table (on a
fake GPU: CPU tensors report a GPU's device key, and the clock is faked)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

import python_native as pn

# isort: split
from calibration_testing import FAKE_DEVICE, table
from first_use_testing import overridden, sub_of

from conftest import TEST_DSL, always, marked_sub
from python_native.features import calibration
from python_native.features.calibration import first_use
from python_native.foundations import env
from python_native.tools import report


def test_the_first_call_of_a_size_is_measured_answered_by_the_winner_and_kept(bench, overrides, caplog):
    bench.clock.timings = lambda n: (1.0, 2.0) if n == 256 else (2.0, 1.0)  # wins at 256 elements only
    overrides("sub.Tensor", always, marked_sub)
    small, large = torch.ones(4, 64), torch.ones(64, 64)
    with caplog.at_level(logging.DEBUG, logger="python_native"):
        with pn.trace() as t:
            assert torch.equal(sub_of(small), overridden(small))  # measured: the override is faster
            assert torch.equal(sub_of(large), torch.zeros_like(large))  # measured: aten is faster
            for _ in range(3):  # known from now on: no second measurement
                assert torch.equal(sub_of(small), overridden(small))
                assert torch.equal(sub_of(large), torch.zeros_like(large))
    assert bench.clock.asked == [(4, 64), (64, 64)]
    assert [e.outcome for e in t.events[:2]] == ["override", "fallback"]
    said = [r.getMessage() for r in caplog.records if "first use" in r.getMessage()]
    assert len(said) == 2 and "override 1.0000 ms, aten 2.0000 ms (2.00x): the override fires" in said[0]
    assert f"{TEST_DSL} sub.Tensor float32 size bucket 9 (narrow rows) on {FAKE_DEVICE}" in said[0]
    rows = bench.user_rows()
    assert [(r["op"], r["bucket"], r["last_dim"], r["wins"], r["first_use"]) for r in rows] == [
        ("sub.Tensor", 9, 64, True, True), ("sub.Tensor", 13, 64, False, True)]
    assert calibration.wins("sub.Tensor", "float32", 9, FAKE_DEVICE, TEST_DSL, last_dim=64) is True
    assert calibration.wins("sub.Tensor", "float32", 10, FAKE_DEVICE, TEST_DSL, last_dim=64) is False  # never filled


def test_the_calibration_command_lists_each_verdict_with_its_source(bench, overrides):
    overrides("sub.Tensor", always, marked_sub)
    sub_of(torch.ones(4, 64))
    info = calibration.describe()
    [device] = [d for d in info["devices"] if d["device"] == FAKE_DEVICE]
    assert device["measuring"] is True
    assert device["first_use"] == [{"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 9,
                                    "rows": "narrow", "fires": True, "source": "this process"}]
    assert info["benchmark"]["mode"] is True and info["benchmark"]["budget_ms"] == 20.0
    text = " ".join(" ".join(report.calibration_lines(info, detail=True)).split())
    assert "first-use verdicts: 1 (1 where the override fires)" in text
    assert f"first use: {TEST_DSL} sub.Tensor float32 2^8..2^9 elements, narrow rows: the override (this process)" in text
    assert f"in force here: first-use verdicts (device {FAKE_DEVICE})" in text
    calibration.reset()  # a later reading of the tables: the verdict is the user's table's now
    [device] = [d for d in calibration.describe()["devices"] if d["device"] == FAKE_DEVICE]
    [path] = bench.user_dir.glob("*.json")
    assert device["first_use"][0]["source"] == str(path)


_SECOND = r"""
import json, sys, types, torch, python_native as pn
from python_native.features import calibration
from python_native.features.calibration import measure
from python_native.foundations import nvml
pn.register_dsl("testdsl", types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: "1"))
nvml.devices = lambda: (nvml.Gpu("Fake GPU 80GB", 9, 9),)
calibration.set_device_key_fn(lambda device: "Fake GPU 80GB/sm99")

def never(*args):
    raise AssertionError("measured again")

measure.set_timer(never)
pn.register_op_override("testdsl", "aten", "sub.Tensor", "CPU", lambda s, o, alpha=1: True,
                        lambda s, o, alpha=1: torch.add(s, torch.neg(o) * alpha) + 1000)
out = {}
for name, shape in (("won", (4, 64)), ("lost", (64, 64)), ("never measured", (16, 64))):
    x = torch.ones(shape)
    out[name] = float(torch.sub(x, x)[0, 0])
print(json.dumps({"benchmark": pn.benchmark, "answers": out}))
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_a_second_process_starts_calibrated(bench, overrides, tmp_path, setting):
    """The verdicts a first process measured are read by the next one, which measures nothing
    again; with pn.benchmark off there, a size never measured goes to aten (nothing speaks for it)."""
    bench.clock.timings = lambda n: (1.0, 2.0) if n == 256 else (2.0, 1.0)
    overrides("sub.Tensor", always, marked_sub)
    sub_of(torch.ones(4, 64))
    sub_of(torch.ones(64, 64))
    script = tmp_path / "second.py"
    script.write_text(_SECOND)
    environ = {**os.environ, "XDG_CACHE_HOME": str(bench.calib.cache_home), env.BENCHMARK[0]: setting,
               "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", "TORCH_LOGS": "+python_native"}
    environ.pop(calibration.ENV_VAR, None)
    proc = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["benchmark"] is (setting == "1")
    assert found["answers"]["won"] == 1000.0 and found["answers"]["lost"] == 0.0
    assert found["answers"]["never measured"] == 0.0  # off: aten; on: the clock raises, aten answers


def test_a_verdict_another_process_wrote_is_adopted_without_measuring(bench, overrides):
    """Ranks of one job share the user's folder: a cell another rank measured is read, not timed,
    and of two verdicts for one cell the first written is the one every process keeps."""
    overrides("sub.Tensor", always, marked_sub)
    x, y = torch.ones(4, 64), torch.ones(16, 64)
    sub_of(torch.ones(2))  # this process reads its tables now (there are none)
    theirs = [{"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 9, "last_dim": 64, "wins": False,
               "first_use": True}]
    content = table(FAKE_DEVICE, theirs, dsls={TEST_DSL: "1.2.3"})
    bench.user_dir.mkdir(parents=True, exist_ok=True)
    name = calibration.sources.user_table_filename(FAKE_DEVICE, calibration.sources.table_versions(content))
    (bench.user_dir / name).write_text(json.dumps(content))  # written by another process meanwhile
    assert torch.equal(sub_of(x), torch.zeros_like(x)) and bench.clock.asked == [(2,)]

    def their_rank_first(ours, aten, t):  # another rank writes its verdict while this one measures
        rows = [{**theirs[0], "bucket": 11, "wins": False}]
        calibration.store.update_user_table(next(bench.user_dir.glob("*.json")).name,
                                            lambda table: {**table, "rows": table["rows"] + rows})
        return 1.0, 2.0  # this rank found the override faster: the file's verdict wins anyway

    calibration.measure.set_timer(their_rank_first)
    assert torch.equal(sub_of(y), torch.zeros_like(y))
    assert [r["wins"] for r in bench.user_rows() if r["bucket"] == 11] == [False]


def test_arguments_the_op_writes_are_copied_and_the_random_state_kept(bench, overrides):
    """Outputs of the timed calls are discarded: an in-place op changes the caller's tensor once,
    and torch's random state is as if only the answering call ran."""
    def add_(self, other, alpha=1):
        torch.rand(1)  # one draw per call
        return self.copy_(self + other * alpha)

    overrides("add_.Tensor", always, add_)
    x, one = torch.zeros(4, 64), torch.ones(4, 64)
    torch.manual_seed(0)
    x.add_(one)
    after = torch.rand(3)
    torch.manual_seed(0)
    torch.rand(1)
    assert bench.clock.asked == [(4, 64)] and torch.equal(x, one) and torch.equal(after, torch.rand(3))


def test_modes_and_the_variable_that_seeds_them(bench, overrides, monkeypatch):
    """True measures every cell no table row measured; "unmeasured" only where no table speaks for
    the op and dtype; a bad value is refused, or (in the variable) warned about and off."""
    rows = [{"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 9, "last_dim": 64, "wins": True}]
    bench.calib.user(table(FAKE_DEVICE, rows, dsls={TEST_DSL: "1.2.3"}))
    overrides("sub.Tensor", always, marked_sub)
    for shape in ((4, 64), (16, 64), (16, 64, 2)):
        sub_of(torch.ones(shape, dtype=torch.float64 if len(shape) == 3 else torch.float32))
    assert bench.clock.asked == [(16, 64), (16, 64, 2)]  # bucket 9 was measured by the table
    calibration.set_benchmark("unmeasured")
    sub_of(torch.ones(64, 64))  # the table speaks for float32 (from its bucket 9): no measurement
    sub_of(torch.ones(64, 64, dtype=torch.bfloat16))  # nothing speaks for bfloat16
    assert bench.clock.asked[2:] == [(64, 64)] and pn.benchmark == "unmeasured"
    with pytest.raises(ValueError, match="pn.benchmark must be False, True or 'unmeasured', got 'yes'"):
        pn.benchmark = "yes"
    with pn.benchmark_set(False):
        assert pn.benchmark is False
    assert pn.benchmark == "unmeasured"
    for value, expected in (("1", True), ("unmeasured", "unmeasured"), ("sometimes", False), ("off", False)):
        monkeypatch.setenv(env.BENCHMARK[0], value)
        first_use._mode = None  # read again, as a fresh process reads it
        if value == "sometimes":
            with pytest.warns(UserWarning, match="PYTHON_NATIVE_BENCHMARK"):
                assert pn.benchmark is False
            assert "not a flag value" in next(s["problem"] for s in env.current() if s["name"] == env.BENCHMARK[0])
        else:
            assert pn.benchmark == expected


def test_nothing_is_measured_where_calibration_is_off_forced_portable_or_not_a_gpu(bench, overrides):
    overrides("sub.Tensor", always, marked_sub)
    for setting in (calibration.OFF, calibration.PORTABLE):
        bench.calib.env(setting)
        assert torch.equal(sub_of(torch.ones(4, 64)), overridden(torch.ones(4, 64)))  # no gate, or no verdict
    bench.calib.env(None)
    bench.calib.device("cpu")  # the interpreter's own device: speed is no question there
    sub_of(torch.ones(4, 64))
    assert bench.clock.asked == []


def test_a_failing_measurement_leaves_the_call_to_aten_and_nothing_on_disk(bench, overrides, caplog):
    def broken(ours, aten, t):
        raise RuntimeError("out of memory")

    calibration.measure.set_timer(broken)
    overrides("sub.Tensor", always, marked_sub)
    x = torch.ones(4, 64)
    with caplog.at_level(logging.WARNING, logger="python_native"):
        assert torch.equal(sub_of(x), torch.zeros_like(x))
    assert "could not be measured (RuntimeError: out of memory); aten serves it" in caplog.text
    assert bench.user_rows() == [] and torch.equal(sub_of(x), torch.zeros_like(x))

