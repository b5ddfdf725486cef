"""Host time per call of each Triton override on a tiny input, against aten's for the same torch call (GPU).

Run on a GPU machine: ``PYTHONPATH=. python benchmarks/host_overhead.py [--json]``.

Each figure is the wall time of a loop of back-to-back calls divided by their number, the GPU
synchronized before and after: on 8x64 inputs the kernels take a few microseconds, so the loop
is bound by the host and the figure is what a call costs the CPU (dispatcher, router, cond,
impl, output allocation and the launch itself). Per op the median of ``--repeat`` loops is taken,
and of ``--rounds`` alternating runs of the two children the best.

The aten baseline runs in a child process started with ``PYTHON_NATIVE_DISABLE=1``, where no
override is installed at all, so it is aten's own path with nothing of this package in front of
it. The same calls then run in a second child with the overrides installed; ``x aten`` is the
ratio of the two figures. With a calibration table in force for this GPU (one ships for the
H100), or the portable policy on any other GPU, tiny calls are declined and pay the router's
fallback instead, and ops that never win are not installed; ``PYTHON_NATIVE_CALIBRATION=off``
shows the overrides firing. Calls whose override declines (calibration, cond) are marked, since
they measure the router's fallback rather than a kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def loop_us(fn: Callable[[], object], number: int, repeat: int, warmup: int = 50) -> float:
    """Median over ``repeat`` loops of ``number`` back-to-back calls of microseconds per call,
    the GPU synchronized around each loop (host-bound for tiny inputs: the host's cost per call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    loops = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        torch.cuda.synchronize()
        loops.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(loops)


def _measure(number: int, repeat: int) -> dict[str, dict]:
    """Runs in a child: per op, the median host microseconds per call and whether Triton fired."""
    import torch
    from launch_overhead import _cases

    import python_native as pn

    out: dict[str, dict] = {}
    add_a, add_b = torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda")
    cases = {"aten add (reference)": lambda: torch.add(add_a, add_b), **_cases("cuda")}
    for op, fn in cases.items():
        with pn.trace() as t:
            fn()
        fired = any(e.dsl == "triton" and e.outcome == "override" for e in t.events)
        out[op] = {"us": loop_us(fn, number, repeat), "fired": fired}
    return out


def _child(disable: bool, number: int, repeat: int) -> dict[str, dict]:
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "0", "TRITON_INTERPRET": "0"}
    if disable:
        env["PYTHON_NATIVE_DISABLE"] = "1"
    else:
        env.pop("PYTHON_NATIVE_DISABLE", None)
    cmd = [sys.executable, __file__, "--child", "--number", str(number), "--repeat", str(repeat)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=1000, help="calls per timed loop")
    parser.add_argument("--repeat", type=int, default=7, help="timed loops per op (the median is kept)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two children (best kept)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.number, args.repeat)))
        return 0
    # Alternate the two children and keep each op's best round: the host's speed drifts between
    # processes more than the figures differ.
    aten: dict[str, dict] = {}
    ours: dict[str, dict] = {}
    for _ in range(args.rounds):
        for side, disable in ((aten, True), (ours, False)):
            for op, figure in _child(disable, args.number, args.repeat).items():
                if op not in side or figure["us"] < side[op]["us"]:
                    side[op] = figure
    import torch

    rows = []
    for op, base in aten.items():
        mine = ours[op]
        rows.append(
            {
                "op": op,
                "aten_us": round(base["us"], 2),
                "ours_us": round(mine["us"], 2),
                "ratio": round(mine["us"] / base["us"], 3),
                "fired": mine["fired"],
            }
        )
    env = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "input": "8x64 fp32",
    }
    if args.json:
        print(json.dumps({"environment": env, "rows": rows}, indent=1))
        return 0
    print(f"{env['device']}; torch {env['torch']}; {env['input']}; host us per call, median of {args.repeat} loops")
    print(f"{'op':32} {'aten':>8} {'ours':>8} {'x aten':>7}")
    for r in rows:
        note = "" if r["fired"] or r["op"].startswith("aten add") else "   (declined: fallback path)"
        print(f"{r['op']:32} {r['aten_us']:8.2f} {r['ours_us']:8.2f} {r['ratio']:7.2f}{note}")
    fired = [r["ratio"] for r in rows if r["fired"]]
    if fired:
        print(f"overrides that fired: worst {max(fired):.2f}x aten, median {statistics.median(fired):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
