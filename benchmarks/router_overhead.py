"""Per-call cost of python-native's dispatch, per front, against plain aten and torch's in-tree ``torch._native``.

Run: ``python benchmarks/router_overhead.py`` (CPU is enough: the cost measured is Python and
dispatcher work, not kernel time). Every figure is a median over timed batches; rounds alternate
the fronts and re-measure the plain aten calls, and each ratio is the median of the per-round
ratios, so drift of the machine cancels. On tiny CPU tensors, per front:

- *disabled op*: an overridden op while ``operations_disabled`` holds it;
- *nothing active*: an op whose only override's DSL is switched off;
- *gate-declined*: an op whose override's calibration gate declines the call (a table for the
  ``cpu`` device saying the override loses at this size);
- *hit*: an override that fires (its impl returns an input);
- *hit, variants*: the same on an override declaring variants, running a chosen one (not its default);
each against the same op with no override at all (*plain aten*); and *toggle*: one
``with operations_disabled(op): pass``, against torch's in-tree toggle.
The compiled front is built first if this torch has none (``python -m python_native precompile``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit
import types
import warnings

import torch
from packaging.version import Version

import python_native as pn
from python_native.features import calibration, front
from python_native.foundations import safe_write

warnings.filterwarnings("ignore")

A = torch.randn(4)  # 4 elements: size bucket 3
B = torch.randn(4)
OPS = {"disabled": torch.mul, "nothing_active": torch.div, "gate_declined": torch.maximum, "hit": torch.sub,
       "hit_variants": torch.atan2}
SCHEMAS = {"disabled": "mul.Tensor", "nothing_active": "div.Tensor", "gate_declined": "maximum", "hit": "sub.Tensor",
           "hit_variants": "atan2"}


def impl(self, other, *args, **kwargs):
    return self


def other_impl(self, other, *args, **kwargs):
    return self


def accept(*args, **kwargs):
    return True


def median_us(fn, number: int, repeat: int) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _register_dsls() -> None:
    for name in ("bench", "bench_off"):
        if name not in pn.all_dsls:
            pn.register_dsl(name, types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("0")))


def _table() -> str:
    """A calibration table for this process's CPU device: the override of maximum loses at bucket 3."""
    rows = [{"dsl": "bench", "op": "maximum", "dtype": "float32", "bucket": b, "wins": b > 10, "last_dim": 4}
            for b in range(0, 21)]
    table = {"format": calibration.FORMAT, "device": "cpu", "torch": torch.__version__, "rows": rows}
    return str(safe_write.new_temp_file(json.dumps(table), prefix="router-overhead-", suffix=".json"))


def _install() -> list:
    handles = [pn.register_op_override("bench", "aten", SCHEMAS[k], "CPU", accept, impl) for k in ("disabled", "hit")]
    handles.append(pn.register_op_override("bench_off", "aten", SCHEMAS["nothing_active"], "CPU", accept, impl))
    gate = calibration.gated("maximum", accept, "bench")
    handles.append(pn.register_op_override("bench", "aten", SCHEMAS["gate_declined"], "CPU", gate, impl))
    handles.append(pn.register_op_override("bench", "aten", SCHEMAS["hit_variants"], "CPU", accept, impl,
                                           variants={"other": other_impl, "third": impl}))
    pn.set_override_variant(SCHEMAS["hit_variants"], "other")
    pn.bench_off.disable()
    pn.disable_operations("mul")
    return handles


def _uninstall(handles: list) -> None:
    pn.enable_operations("mul")
    pn.bench_off.enable()
    for h in handles:
        h.remove()


def measure(rounds: int, number: int, repeat: int) -> dict:
    _register_dsls()
    rows: dict[str, dict[str, list[float]]] = {"python": {}, "compiled": {}, "plain": {}}

    def toggle():
        with pn.operations_disabled("sub"):
            pass

    for _ in range(rounds):
        for case, fn in OPS.items():
            rows["plain"].setdefault(case, []).append(median_us(lambda f=fn: f(A, B), number, repeat))
        for which in ("python", "compiled"):
            with front.serving(which):
                handles = _install()
                for case, fn in OPS.items():
                    rows[which].setdefault(case, []).append(median_us(lambda f=fn: f(A, B), number, repeat))
                rows[which].setdefault("toggle", []).append(median_us(toggle, number // 10, repeat))
                _uninstall(handles)
    return rows


def in_tree_toggle(number: int, repeat: int) -> float | None:
    """torch's in-tree registry toggling one override of its own (torch >= 2.13), routing it itself."""
    try:
        import torch._native.registry as tn
    except ImportError:
        return None
    from python_native.panel import native_bridge

    with native_bridge.standalone():
        tn.register_op_override("bench", "aten", "rsub.Tensor", "CPU", accept, impl)
        tn._register_overrides_from_graph("rsub.Tensor", "CPU", tn._graphs[("rsub.Tensor", "CPU")])

        def toggle():
            tn.deregister_op_overrides(disable_op_symbols=["rsub.Tensor"])
            tn.reenable_op_overrides(enable_op_symbols=["rsub.Tensor"])

        figure = median_us(toggle, max(number // 100, 10), repeat)
        tn.deregister_op_overrides(disable_op_symbols=["rsub.Tensor"])
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds alternating the fronts")
    parser.add_argument("--number", type=int, default=20000, help="calls per timed batch")
    parser.add_argument("--repeat", type=int, default=7, help="timed batches per figure (the median is kept)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    built = front.ensure_built()
    table = _table()
    os.environ[calibration.ENV_VAR] = table
    calibration.reset()
    try:
        rows = measure(args.rounds, args.number, args.repeat)
    finally:
        os.unlink(table)
    toggle_in_tree = in_tree_toggle(args.number, args.repeat)
    med = {which: {case: statistics.median(v) for case, v in cases.items()} for which, cases in rows.items()}
    ratio = {
        which: {case: statistics.median(a / b for a, b in zip(rows[which][case], rows["plain"][case], strict=True))
                for case in OPS}
        for which in ("python", "compiled")
    }
    if args.json:
        print(json.dumps({"medians_us": med, "ratio_to_plain": ratio, "toggle_in_tree_us": toggle_in_tree,
                          "front": built}, indent=2))
        return 0
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device cpu, {args.rounds} rounds; "
          "medians in microseconds (ratio: the same op with no override)")
    print(f"{'':22}{'plain aten':>12}{'python front':>22}{'compiled front':>22}")
    for case in OPS:
        print(f"  {case:20}{med['plain'][case]:12.3f}"
              f"{med['python'][case]:12.3f} ({ratio['python'][case]:5.2f}x)"
              f"{med['compiled'][case]:12.3f} ({ratio['compiled'][case]:5.2f}x)")
    print(f"  {'toggle':20}{'':12}{med['python']['toggle']:12.3f}{'':9}{med['compiled']['toggle']:12.3f}")
    hit = med["compiled"]["hit"] / med["python"]["hit"]
    print(f"hit, compiled / python front: {hit:.3f} (target <= 1.00 within noise)")
    for which in ("python", "compiled"):
        same = statistics.median(a / b for a, b in zip(rows[which]["hit_variants"], rows[which]["hit"], strict=True))
        print(f"hit with variants / hit without, {which} front: {same:.3f} (target 1.00 within noise)")
    for case in ("disabled", "nothing_active", "gate_declined"):
        print(f"{case}, compiled front / plain aten: {ratio['compiled'][case]:.3f} (target <= 1.10)")
    if toggle_in_tree is not None:
        for which in ("python", "compiled"):
            print(f"toggle, {which} front / torch._native's ({toggle_in_tree:.3f}): "
                  f"{med[which]['toggle'] / toggle_in_tree:.3f} (target <= 0.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
