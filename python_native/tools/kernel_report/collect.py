"""The report's data: every benchmark row's calls, their launches, and each launch's figures.

``collect`` walks ``bench.rows.cases`` (the LLM rows and the grid, per dtype), records each row's
aten calls (``calls``), lets every Triton override that takes one plan and launch it
(``launches``), counts each launch's bytes in the interpreter (``traffic``) and compiles each
distinct specialization for the target (``compile``). Figures are plain dicts, ready for ``--json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from python_native.tools.bench import rows
from python_native.tools.kernel_report import arch as arch_table
from python_native.tools.kernel_report import calls as call_records
from python_native.tools.kernel_report.compile import compile_all, request, specialization_key
from python_native.tools.kernel_report.launches import Launch, RecordedCall, record_call
from python_native.tools.kernel_report.model import COPY_EFFICIENCY, launch_time
from python_native.tools.kernel_report.traffic import Traffic, count

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

METHODS = {
    "launches": "the override's own cond and impl on CPU stand-ins of the benchmark row's aten calls (recorded on "
                "meta tensors), kernel launches stubbed and persistent grids planned for the target's SM count",
    "regs, spills": "Triton's compile for the target without a GPU (ptxas from Triton's wheel), then "
                    "`cuobjdump -res-usage` on the cubin: REG, and LOCAL (per-thread local memory: spills)",
    "shared, warps": "the compiled kernel's metadata (dynamic shared memory per program, num_warps)",
    "occupancy": "programs per SM from registers (256-register units per warp), warps, shared memory "
                 "(+1 KB reserved per program) and the block limit of the architecture table",
    "waves": "programs / (programs per SM x SMs of the reference GPU); tail: fill of the last wave",
    "bytes": "the launch's own arguments at full size, some programs run in Triton's interpreter (first and last "
             "per grid axis), masked loads/stores counted per active lane; broadcast reads (every program, "
             "same addresses) counted once; scaled to the grid",
    "minimum": "every input tensor the kernels read, once (the memory it spans, or its elements where they leave gaps: an expanded index counts its one column, a half of a chunked projection its half), plus every output, once; intermediate buffers are overhead",
    "predicted": "bytes at the copy bandwidth, each SM's share scaled by min(1, warps on it / 32), per wave, "
                 "+1.5 us per launch (python_native.tools.kernel_report.model)",
}


def _traffic_key(launch: Launch) -> tuple:
    def arg(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (a.dtype, tuple(a.shape), tuple(a.stride()))
        return a

    fn = getattr(launch.kernel, "fn", launch.kernel)
    return (fn.__module__, fn.__name__, launch.grid, tuple(map(arg, launch.args)),
            tuple(sorted(launch.constexprs.items())), launch.num_warps)


_traffic_cache: dict[tuple, tuple[Traffic, dict[int, str]]] = {}


def _roles(recorded: RecordedCall, traffic: Traffic) -> dict[int, str]:
    """``input`` / ``output`` / ``scratch`` per region, by the call's inputs and the impl's outputs."""
    def within(start: int, tensors: list[torch.Tensor]) -> bool:
        return any(t.numel() and t.data_ptr() <= start < t.data_ptr() + t.untyped_storage().nbytes() for t in tensors)

    return {start: "input" if within(start, recorded.inputs()) else "output" if within(start, recorded.outputs)
            else "scratch" for start in traffic.regions}


def _launch_figures(recorded: RecordedCall, launch: Launch, with_traffic: bool, arch: str) -> dict:
    figures: dict[str, Any] = {
        "kernel": launch.name, "grid": list(launch.grid), "programs": launch.programs, "num_warps": launch.num_warps,
        "constexprs": {k: v if isinstance(v, (int, float, bool, str, type(None))) else str(v)
                       for k, v in launch.constexprs.items()}, "specialization": specialization_key(launch, arch), "request": request(launch),
    }
    if not with_traffic:
        return figures
    key = _traffic_key(launch)
    if key not in _traffic_cache:
        try:
            traffic = count(launch)
        except Exception as e:  # a data-dependent kernel may stray on uninitialized stand-ins: reported, not fatal
            _traffic_cache[key] = (None, f"{type(e).__name__}: {_last_line(e)}")
        else:
            _traffic_cache[key] = (traffic, _roles(recorded, traffic))
    traffic, roles = _traffic_cache[key]
    if traffic is None:
        figures["bytes_error"] = roles
        return figures
    regions = []
    for start, region in traffic.regions.items():
        regions.append({
            "args": region.names, "role": roles[start], "read": traffic.read[start], "written": traffic.written[start],
            "broadcast": start in traffic.broadcast, "nbytes": region.end - region.start,
            # a view with gaps (a half of a chunked projection) spans more memory than it holds
            "held": min(region.end - region.start, region.tensor.numel() * region.tensor.element_size()),
        })
    figures.update(bytes=traffic.total, regions=regions, sampled_programs=traffic.sampled)
    return figures


def _last_line(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    return lines[-1] if lines else ""


def _minimum(call: dict) -> float:
    """Bytes of the inputs some launch read plus the outputs: each once."""
    read = set()
    for launch in call["launches"]:
        for r in launch.get("regions", ()):
            if r["role"] == "input" and r["read"]:
                read.add((tuple(r["args"]), r["held"]))
    return float(sum(n for _, n in read) + call["output_bytes"])


def collect(
    arch_name: str = arch_table.DEFAULT_ARCH, ops: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = DTYPES, with_traffic: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every benchmark row of ``ops`` (default: all) in ``dtypes``, with its calls and their launches."""
    a = arch_table.arch(arch_name)
    specs = call_records.triton_overrides()
    started = time.perf_counter()
    cases_out = []
    requests: dict[tuple, dict] = {}
    for case in rows.cases(list(dtypes), quick=False, ops=ops):
        if progress is not None:
            progress(f"{case.label} {case.dtype_name}")
        calls_out = []
        for call in call_records.calls_of(case, set(specs)):
            family, spec = specs[call.op]
            recorded = record_call(call, family, spec, a.sm_count)
            entry: dict[str, Any] = {"op": call.op, "family": family, "declined": recorded.declined,
                                     "output_bytes": sum(t.numel() * t.element_size() for t in recorded.outputs)}
            entry["launches"] = [_launch_figures(recorded, launch, with_traffic, arch_name) for launch in recorded.launches]
            for launch in entry["launches"]:
                requests.setdefault(launch["specialization"], launch["request"])
            if with_traffic and recorded.launches and all("bytes" in launch for launch in entry["launches"]):
                entry["minimum"] = _minimum(entry)
                entry["bytes"] = sum(launch["bytes"] for launch in entry["launches"])
                entry["ratio"] = entry["bytes"] / entry["minimum"] if entry["minimum"] else None
            calls_out.append(entry)
            del recorded
        cases_out.append({"op": case.op, "mode": case.mode, "shape": list(case.shape), "dtype": case.dtype_name,
                          "label": case.label, "bench_bytes": rows.bytes_moved(case), "calls": calls_out})
    traffic_s = time.perf_counter() - started
    figures = compile_all(requests, a.capability)
    for case in cases_out:
        _predict(case, figures, a)
    return {
        "arch": a.name, "gpu": a.gpu, "bytes_counted": with_traffic, "sm_count": a.sm_count, "bandwidth_gbps": a.bandwidth_gbps,
        "methods": METHODS, "cases": cases_out, "seconds": {"plans_and_bytes": round(traffic_s, 1),
                                                            "compile": round(time.perf_counter() - started - traffic_s, 1)},
    }


def _predict(case: dict, figures: dict[tuple, dict], a: arch_table.Arch) -> None:
    """Attach each launch's compile figures, occupancy, waves and predicted time; the row's total."""
    total_us = 0.0
    for call in case["calls"]:
        for launch in call["launches"]:
            fig = figures[launch.pop("specialization")]
            launch.pop("request")
            launch["compiled"] = fig
            if "error" in fig:
                continue
            occ = arch_table.occupancy(a, fig["regs"], fig["num_warps"], fig["shared"])
            w = arch_table.waves(a, launch["programs"], occ, fig["num_warps"])
            launch["occupancy"] = {"blocks_per_sm": occ.blocks_per_sm, "resident_warps": occ.resident_warps,
                                   "occupancy": round(occ.occupancy, 3), "limit": occ.limit}
            launch["waves"] = {"waves": round(w.waves, 2), "tail": round(w.tail, 3), "warps_per_sm": round(w.warps_per_sm, 1)}
            if "bytes" in launch:
                t = launch_time(a, launch["bytes"], launch["programs"], fig["regs"], fig["num_warps"], fig["shared"])
                launch["predicted_us"] = round(t.microseconds, 2)
                launch["bandwidth_share"] = round(t.bandwidth_share, 3)
                total_us += t.microseconds
    if total_us:
        copy = a.bandwidth_gbps * 1e3 * COPY_EFFICIENCY
        case["predicted_us"] = round(total_us, 1)
        case["predicted_copy_fraction"] = round(case["bench_bytes"] / copy / total_us, 3)
