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
shows the overrides firing (``--no-calibration`` sets it for both children). Calls whose override
declines (calibration, cond) are marked, since they measure the router's fallback rather than a
kernel.

A third child runs the same calls with replay on (``PYTHON_NATIVE_REPLAY=1``): the compiled front
serves each call after the first from the launches recorded for its key, without entering Python
(``features/front/replay.py``). ``replay`` and its ratio are that child's figures; a row the front
did not replay is marked. The goal for tiny hits of the replayable ops (softmax, log_softmax, the
norms forward and backward, bmm outer) is at most 1.10x aten, as a geometric mean over them.
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


def _replayed_so_far() -> int:
    """Calls the compiled front served from records so far (0 where it does not serve)."""
    from python_native.features import front

    slots = front.describe().get("replay", {}).get("slots", {})
    return sum(s["replayed"] for s in slots.values())


def _measure(number: int, repeat: int) -> dict[str, dict]:
    """Runs in a child: per op, the median host microseconds per call, whether Triton fired and
    whether the compiled front replayed the timed calls."""
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
        before = _replayed_so_far()
        us = loop_us(fn, number, repeat)
        out[op] = {"us": us, "fired": fired, "replayed": _replayed_so_far() - before >= number * repeat}
    return out


def _child(side: str, number: int, repeat: int, no_calibration: bool) -> dict[str, dict]:
    """``side``: "aten" (no override installed), "ours" (replay off) or "replay" (replay on)."""
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "0", "TRITON_INTERPRET": "0",
           "PYTHON_NATIVE_REPLAY": "1" if side == "replay" else "0"}
    if no_calibration:
        env["PYTHON_NATIVE_CALIBRATION"] = "off"
    if side == "aten":
        env["PYTHON_NATIVE_DISABLE"] = "1"
    else:
        env.pop("PYTHON_NATIVE_DISABLE", None)
    cmd = [sys.executable, __file__, "--child", "--number", str(number), "--repeat", str(repeat)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


REPLAYABLE = ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
              "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward", "bmm")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=1000, help="calls per timed loop")
    parser.add_argument("--repeat", type=int, default=7, help="timed loops per op (the median is kept)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the children (best kept)")
    parser.add_argument("--no-calibration", action="store_true",
                        help="PYTHON_NATIVE_CALIBRATION=off in the children: tiny calls fire instead of being declined")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.number, args.repeat)))
        return 0
    # Alternate the children and keep each op's best round: the host's speed drifts between
    # processes more than the figures differ.
    sides: dict[str, dict[str, dict]] = {"aten": {}, "ours": {}, "replay": {}}
    for _ in range(args.rounds):
        for name, side in sides.items():
            for op, figure in _child(name, args.number, args.repeat, args.no_calibration).items():
                if op not in side or figure["us"] < side[op]["us"]:
                    side[op] = figure
    rows = _rows(sides)
    import torch

    env = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "input": "8x64 fp32",
        "calibration": "off" if args.no_calibration else "as configured",
    }
    if args.json:
        print(json.dumps({"environment": env, "rows": rows}, indent=1))
        return 0
    _print(env, rows, args.repeat)
    return 0


def _rows(sides: dict[str, dict[str, dict]]) -> list[dict]:
    rows = []
    for op, base in sides["aten"].items():
        mine, replayed = sides["ours"][op], sides["replay"][op]
        rows.append({
            "op": op, "aten_us": round(base["us"], 2), "ours_us": round(mine["us"], 2),
            "ratio": round(mine["us"] / base["us"], 3), "fired": mine["fired"],
            "replay_us": round(replayed["us"], 2), "replay_ratio": round(replayed["us"] / base["us"], 3),
            "replayed": replayed["replayed"],
        })
    return rows


def _print(env: dict, rows: list[dict], repeat: int) -> None:
    print(f"{env['device']}; torch {env['torch']}; {env['input']}; calibration {env['calibration']}; "
          f"host us per call, median of {repeat} loops")
    print(f"{'op':32} {'aten':>8} {'ours':>8} {'x aten':>7} {'replay':>8} {'x aten':>7}")
    for r in rows:
        note = "" if r["fired"] or r["op"].startswith("aten add") else "   (declined: fallback path)"
        if r["op"] in REPLAYABLE and not r["replayed"]:
            note += "   (not replayed)"
        print(f"{r['op']:32} {r['aten_us']:8.2f} {r['ours_us']:8.2f} {r['ratio']:7.2f} "
              f"{r['replay_us']:8.2f} {r['replay_ratio']:7.2f}{note}")
    fired = [r["ratio"] for r in rows if r["fired"]]
    if fired:
        print(f"overrides that fired: worst {max(fired):.2f}x aten, median {statistics.median(fired):.2f}x")
    hits = [r["replay_ratio"] for r in rows if r["op"] in REPLAYABLE and r["fired"] and r["replayed"]]
    if hits:
        print(f"replayed hits ({len(hits)} of {len(REPLAYABLE)} replayable ops): geometric mean "
              f"{statistics.geometric_mean(hits):.2f}x aten, worst {max(hits):.2f}x (goal: at most 1.10x)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
