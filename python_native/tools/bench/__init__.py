"""Benchmark of the overrides against aten (and other libraries when installed), per op, dtype, shape.

Every row runs the same torch call in one process: with the overrides on, then under
``pn.triton.disabled()`` (aten), plus ``torch.compile`` of the same function (Inductor) and the
Liger-Kernel / QuACK equivalents where those packages are installed ("–" otherwise). On a GPU the
timer is ``triton.testing.do_bench`` (median of many runs after warm-up; input gradients reset to
None between runs of fwd+bwd rows). ``bandwidth`` is the fraction of the device's measured copy
bandwidth the override reaches, from the bytes the op must move (its shapes and dtypes).
``fired`` says whether an override ran (``pn.trace()``); only those rows enter the geometric mean.

Without a GPU, ``quick`` runs tiny shapes through Triton's interpreter: that proves the path end to
end, its timings say nothing about speed.

Its modules: ``timing`` (timers, copy bandwidth), ``rows`` (the rows the op declarations carry:
shapes, inputs, torch calls, bytes moved), ``peers`` (Inductor, Liger-Kernel, QuACK), ``measure``
(one row, a run, its environment, the command's choices), ``output`` (table, geometric mean, plot,
JSON), ``calibrating`` (calibration tables), ``memory`` (peak memory of one call), ``progress`` (a
long run's progress) and ``replay_proof`` (``bench --prove-replay``).
"""

from python_native.tools.bench.calibrating import (
    CalibArgs,
    calibrate,
    calibrated_dsls,
    calibration_shapes,
    calibration_steps,
    device_properties,
)
from python_native.tools.bench.measure import (
    environment,
    measure_case,
    parse_dtypes,
    parse_ops,
    pick_device,
    run_rows,
    runner,
)
from python_native.tools.bench.output import HEADER, MISSING, format_row, geometric_mean_line, json_document, plot
from python_native.tools.bench.peers import competitors
from python_native.tools.bench.rows import (
    OPS,
    Case,
    Inputs,
    Row,
    bytes_moved,
    cases,
    make_inputs,
    symbols_of,
    torch_function,
)
from python_native.tools.bench.timing import Fn, Timer, copy_bandwidth, cpu_timer, gpu_throughput_timer, gpu_timer

__all__ = [
    "HEADER", "MISSING", "OPS", "CalibArgs", "Case", "Fn", "Inputs", "Row", "Timer", "bytes_moved",
    "calibrate", "calibrated_dsls", "calibration_shapes", "calibration_steps", "cases", "competitors", "copy_bandwidth", "cpu_timer", "device_properties",
    "environment", "format_row", "geometric_mean_line", "gpu_throughput_timer", "gpu_timer", "json_document",
    "make_inputs", "measure_case", "parse_dtypes", "parse_ops", "pick_device", "plot", "run_rows", "runner", "symbols_of",
    "torch_function",
]
