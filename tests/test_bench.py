"""``python -m python_native bench``: rows, plot and calibration table, end to end (tiny shapes).

The command runs where the Triton backend does: through Triton's interpreter on CPU tensors, or on
the GPU when the kernels run there.
"""

from __future__ import annotations

import json

import pytest
import torch

import python_native as pn  # noqa: F401  (first: registers the backends)

# isort: split
import python_native_dsls.triton as backend
from python_native.__main__ import main
from python_native.features import calibration
from python_native.foundations import env
from python_native.tools import bench

pytestmark = pytest.mark.skipif(not backend.runtime_available(), reason="triton backend unavailable")
ON_GPU = backend.device_type() == "cuda"

ROW_FIELDS = {"op", "mode", "shape", "dtype", "fired", "override_ms", "aten_ms", "speedup", "bytes",
              "bandwidth_fraction", "inductor_ms", "liger_ms", "quack_ms", "notes", "variants_ms"}


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_quick_json_rows(capsys):
    assert main(["bench", "--quick", "--json", "--dtypes", "float32", "--ops", "softmax"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environment"]["torch"] == torch.__version__
    rows = report["rows"]
    assert [(r["op"], r["mode"], r["shape"]) for r in rows] == [
        ("softmax", "fwd", [4, 64]), ("softmax", "fwd+bwd", [4, 64]),
        ("softmax", "fwd", [7, 100]), ("softmax", "fwd+bwd", [7, 100]),
    ]
    for row in rows:
        assert set(row) == ROW_FIELDS
        assert row["fired"] is True and row["dtype"] == "float32"
        assert row["override_ms"] > 0 and row["aten_ms"] > 0
        assert row["variants_ms"] == {}  # only with --variants
        assert row["speedup"] == pytest.approx(row["aten_ms"] / row["override_ms"])
        if ON_GPU:
            assert row["inductor_ms"] > 0  # torch.compile's kernels timed beside ours
        else:
            assert row["inductor_ms"] is None  # no Inductor column on the interpreter
    assert rows[0]["bytes"] == 2 * 4 * 64 * 4 and rows[1]["bytes"] == 5 * 4 * 64 * 4


def test_table_output_marks_missing_columns(capsys):
    assert main(["bench", "--quick", "--dtypes", "float32", "--ops", "silu"]) == 0
    out = capsys.readouterr().out
    assert "silu fwd+bwd 4x64" in out and bench.MISSING in out
    assert "geometric-mean speedup where an override fired" in out


def test_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "speedup.png"
    assert main(["bench", "--quick", "--dtypes", "float32", "--ops", "silu", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_named(capsys):
    assert main(["bench", "--quick", "--dtypes", "float64"]) == 2
    assert "'float64'" in capsys.readouterr().err
    assert main(["bench", "--quick", "--ops", "matmul"]) == 2
    assert "'matmul'" in capsys.readouterr().err


def test_help_lists_every_op(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert ", ".join(bench.OPS) in " ".join(capsys.readouterr().out.split())


def test_calibrate_refuses_a_threshold_that_is_not_positive(tmp_path, capsys):
    assert main(["bench", "--calibrate", "--allow-interpreter", "--threshold", "0", "--output", str(tmp_path / "t.json")]) == 2
    assert "--threshold 0.0" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.skipif(ON_GPU, reason="the kernels run on the GPU here: calibrate measures it and has nothing to refuse")
def test_calibrate_refuses_the_interpreter_unless_allowed(tmp_path, capsys):
    assert main(["bench", "--calibrate", "--quick", "--output", str(tmp_path / "t.json")]) == 2
    assert "--allow-interpreter" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_calibrate_writes_a_valid_table(tmp_path, capsys):
    path = tmp_path / "table.json"
    args = ["bench", "--calibrate", "--allow-interpreter", "--quick", "--dtypes", "float32", "--ops", "softmax"]
    assert main([*args, "--output", str(path)]) == 0
    table = calibration.load(path)
    device = torch.device("cuda", torch.cuda.current_device()) if ON_GPU else "cpu"
    assert table["device"] == calibration.device_key(device) and table["torch"] == torch.__version__
    assert table["device"] == "cpu" or table["device"].startswith(torch.cuda.get_device_name(device))
    assert {r["op"] for r in table["rows"]} == {"_softmax", "_softmax_backward_data"}
    assert {r["bucket"] for r in table["rows"]} == {9, 11}  # 256 and 1024 elements
    assert table["threshold"] == 1.05  # the default
    expected = documented_wins(table["rows"], table["threshold"])
    assert [row["wins"] for row in table["rows"]] == expected, [(r["shape"], r["speedup"]) for r in table["rows"]]
    assert str(path) in capsys.readouterr().out


def documented_wins(rows: list[dict], threshold: float) -> list[bool]:
    """Each row's verdict by the rule docs/benchmarks.md states ("The calibration run"): a (DSL, op,
    dtype, width class, size bucket) wins when every shape of it beat aten by ``threshold`` and every
    larger calibrated bucket of its class won too; the largest bucket must clear twice the margin,
    or the next smaller one must clear the threshold too."""
    cells: dict[tuple, dict[int, float]] = {}
    for row in rows:
        key = (row["dsl"], row["op"], row["dtype"], row["last_dim"] >= 4096)  # narrow or wide rows
        cell = cells.setdefault(key, {})
        cell[row["bucket"]] = min(cell.get(row["bucket"], float("inf")), row["speedup"])
    won: dict[tuple, bool] = {}
    for key, speedups in cells.items():
        buckets = sorted(speedups)
        larger_won = True
        for i in range(len(buckets) - 1, -1, -1):
            speedup = speedups[buckets[i]]
            ok = speedup >= threshold and larger_won
            if i == len(buckets) - 1 and i > 0:
                ok = ok and (speedup >= 2 * threshold - 1 or speedups[buckets[i - 1]] >= threshold)
            won[(*key, buckets[i])] = larger_won = ok
    return [won[(row["dsl"], row["op"], row["dtype"], row["last_dim"] >= 4096, row["bucket"])] for row in rows]


def test_table_filename():
    assert calibration.table_filename("NVIDIA H100 80GB HBM3/sm90") == "nvidia_h100_80gb_hbm3_sm90.json"


def test_indexing_rows_fire_and_count_their_bytes(capsys):
    assert main(["bench", "--quick", "--json", "--dtypes", "bfloat16", "--ops", "topk,scatter_add,index_add"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["op"], r["shape"]) for r in rows] == [  # in the order the families declare them
        ("scatter_add", [64, 32, 16]), ("index_add", [64, 32, 16]), ("topk", [4, 64, 4]), ("topk", [7, 100, 20]),
    ]
    # Where a GPU has not timed them yet, they are installed at CUDA only to be measured.
    assert all(r["fired"] is (not ON_GPU or env.unmeasured_allowed()) for r in rows)
    assert rows[2]["bytes"] == 4 * (64 * 2 + 4 * (2 + 8))  # read x, write k values and int64 indices per row
    assert rows[0]["bytes"] == 64 * (32 * 2 + 8) + 2 * 16 * 32 * 2  # source and an index per token, self copied
    full = bench.cases([torch.bfloat16], quick=False, ops=["topk", "scatter_add", "index_add"])
    assert {c.shape for c in full} >= {(1, 128256, 50), (1, 128256, 256), (64, 128256, 50), (4096, 4096, 8),
                                       (16384, 4096, 2048)}


def test_calibrate_covers_the_indexing_ops(tmp_path, capsys):
    path = tmp_path / "table.json"
    args = ["bench", "--calibrate", "--allow-interpreter", "--quick", "--dtypes", "float32", "--ops", "topk,index_add"]
    assert main([*args, "--output", str(path)]) == 0
    table = calibration.load(path)
    measured = not ON_GPU or env.unmeasured_allowed()
    assert {r["op"] for r in table["rows"]} == ({"topk", "index_add", "index_add_"} if measured else set())


@pytest.mark.slow
def test_group_norm_and_dropout_rows(capsys):
    assert main(["bench", "--quick", "--json", "--dtypes", "float32", "--ops", "group_norm_cl,dropout"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["op"], r["mode"], r["shape"]) for r in rows] == [  # in the order the families declare them
        ("dropout", "fwd", [4, 64]), ("dropout", "fwd+bwd", [4, 64]),
        ("group_norm_cl", "fwd", [2, 8, 4, 4]), ("group_norm_cl", "fwd+bwd", [2, 8, 4, 4]),
    ]
    assert all(r["fired"] for r in rows)
    assert rows[0]["bytes"] == 4 * 64 * (2 * 4 + 1)  # x read, y written, a one-byte mask written


def test_diffusion_and_llm_rows_lead_the_full_grid():
    full = bench.cases([torch.bfloat16, torch.float32], quick=False, ops=["group_norm", "group_norm_cl", "dropout"])
    named = {(c.op, c.mode, c.shape, c.dtype) for c in full}
    for op in ("group_norm", "group_norm_cl"):
        for mode in ("fwd", "fwd+bwd"):
            assert {(op, mode, (8, 512, 64, 64), dt) for dt in (torch.bfloat16, torch.float32)} <= named
    assert ("dropout", "fwd+bwd", (8192, 4096), torch.bfloat16) in named
    x = bench.make_inputs(bench.Case("group_norm_cl", "fwd+bwd", (2, 8, 4, 4), torch.float32), "cpu")
    assert x.named["groups"] == 8  # 32 groups, or as many as divide C
    assert bench.make_inputs(bench.Case("group_norm", "fwd", (1, 512, 2, 2), torch.float32), "cpu").named["groups"] == 32
    assert x.x.is_contiguous(memory_format=torch.channels_last) and x.dy.stride() == x.x.stride()


def test_calibration_measures_dropout_and_group_norm(tmp_path, capsys):
    path = tmp_path / "table.json"
    args = ["bench", "--calibrate", "--allow-interpreter", "--quick", "--dtypes", "float32", "--ops", "dropout"]
    assert main([*args, "--output", str(path)]) == 0
    measured = not ON_GPU or env.unmeasured_allowed()  # on a GPU, unmeasured ops install only when asked
    assert {r["op"] for r in calibration.load(path)["rows"]} == (
        {"native_dropout", "native_dropout_backward", "bernoulli_.float"} if measured else set())
    # Group norm's arguments, built from a rows x columns input as the calibration run builds them.
    from python_native.tools.bench.calibrating import _calibration_args, aten_op

    x = torch.randn(2, 64, device=backend.device_type())
    for symbol in ("native_group_norm", "native_group_norm_backward"):
        with pn.trace() as t:
            aten_op(symbol)(*_calibration_args()[symbol](x, torch.randn_like(x)))
        assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == symbol}


def test_variants_add_a_cell_per_variant(capsys):
    assert main(["bench", "--quick", "--json", "--dtypes", "float32", "--ops", "log_softmax", "--variants"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(set(r["variants_ms"]) == {"split", "streamed"} for r in rows)
    assert all(ms > 0 for r in rows for ms in r["variants_ms"].values())
    assert "split" in bench.format_row(bench.Row(**rows[0]))


def test_model_op_rows_fire_forward_and_backward(capsys):
    """The custom ops' rows call torch.ops.python_native (the reference in the aten column)."""
    ops = "rms_norm_gemma,swiglu_chunked,rotary"
    assert main(["bench", "--quick", "--json", "--dtypes", "bfloat16", "--ops", ops]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["op"], r["mode"]) for r in rows] == [(op, mode) for op in bench.OPS if op in ops.split(",")
                                                    for mode in ("fwd", "fwd+bwd")]  # in the rows' order
    assert all(r["fired"] for r in rows)
    by_op = {(r["op"], r["mode"]): r for r in rows}
    assert by_op["swiglu_chunked", "fwd+bwd"]["bytes"] == 2 * 4 * 64 * 8  # gate, up, dy read; y, dgate, dup written
    b, s, h, kv, d = 1, 4, 2, 1, 16
    assert by_op["rotary", "fwd"]["bytes"] == 2 * (2 * b * s * (h + kv) * d + 2 * b * s * d)
    inputs = bench.make_inputs(bench.Case("rotary", "fwd+bwd", (b, s, h, kv, d), torch.float32), "cpu")
    q = inputs.named["q"]
    assert q.is_leaf and q.shape == (b, h, s, d) and q.transpose(1, 2).is_contiguous()
    assert bench.rows.formula("rotary") is not None and bench.rows.formula("softmax") is None


def test_calibration_measures_the_model_ops(tmp_path):
    path = tmp_path / "table.json"
    args = ["bench", "--calibrate", "--allow-interpreter", "--quick", "--dtypes", "float32", "--ops", "swiglu,rotary"]
    assert main([*args, "--output", str(path)]) == 0
    measured = not ON_GPU or env.unmeasured_allowed()
    assert {r["op"] for r in calibration.load(path)["rows"]} == (
        {"swiglu", "swiglu_backward", "rotary", "rotary_backward"} if measured else set())
    from python_native.tools.bench.calibrating import DECLARED, _calibration_args, aten_op

    x = torch.randn(4, 128, device=backend.device_type())
    # The MoE ops' calls are checked the same way in tests/test_bench_moe.py, at their own shapes.
    for symbol in sorted(s for s in DECLARED if not s.startswith("moe_")):
        with pn.trace() as t:
            aten_op(symbol)(*_calibration_args()[symbol](x, torch.randn_like(x)))
        assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == symbol}, symbol


def test_every_row_reaches_the_ops_its_families_name():
    """``--calibrate --ops`` times the aten ops behind each row: the op families name them (``Op.bench``)."""
    from python_native.tools import bench

    assert all(bench.symbols_of([op]) for op in bench.OPS), [op for op in bench.OPS if not bench.symbols_of([op])]
    assert bench.symbols_of(["rms_norm"]) == ["_fused_rms_norm", "_fused_rms_norm_backward"]
    assert bench.symbols_of(["gelu_tanh"]) == ["gelu", "gelu_backward"]
    assert bench.symbols_of(["sum_dim0", "max_dim"]) == ["sum.dim_IntList", "max.dim"]
    assert bench.symbols_of(["dropout"]) == ["native_dropout", "native_dropout_backward", "bernoulli_.float"]
    assert bench.symbols_of(["index_add", "bmm_outer"]) == ["bmm", "index_add", "index_add_"]


def test_every_aten_op_of_the_families_can_be_calibrated():
    """A family's op with no way to build its calibration call would never be timed, so never
    installed on GPUs where it is marked unmeasured: the families and the builders agree."""
    from python_native.tools.bench.calibrating import _calibration_args
    from python_native_dsls.cutedsl.ops import families as cutedsl_families
    from python_native_dsls.triton.ops import families as triton_families

    declared = {b.spec.op for f in [*triton_families(), *cutedsl_families()] for b in f if b.spec.lib == "aten"}
    assert declared <= set(_calibration_args()), declared - set(_calibration_args())
