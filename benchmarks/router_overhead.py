"""Per-call cost of python-native's generated routers, against torch's in-tree ``torch._native``.

Run: ``python benchmarks/router_overhead.py`` (CPU is enough: the cost measured is Python and
dispatcher work, not kernel time). Every figure is a median over many timed batches, and every
ratio compares figures taken in this same process.

Measured, on tiny CPU tensors so the kernel itself costs little:
- *override*: the op through the dispatcher when an override fires, minus a baseline;
- *fallback*: the op when every cond declines, minus the plain aten call of a sibling op;
- *disabled*: the op while ``operations_disabled`` holds it, against a plain aten call;
- *toggle*: one ``with operations_disabled(op): pass``.
Two baselines for *override*: the impl registered bare at the same key (so only the router's own
work counts), and the impl called directly from Python (so the dispatcher's entry into Python
counts too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
import types
import warnings

import torch
from packaging.version import Version

import python_native as pn

warnings.filterwarnings("ignore")

A = torch.randn(4)
B = torch.randn(4)


def impl(self, other, alpha=1):
    return self


def accept(*args, **kwargs):
    return True


def decline(*args, **kwargs):
    return False


def median_us(fn, number: int, repeat: int) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def ours(number: int, repeat: int) -> dict[str, float]:
    if "bench" not in pn.all_dsls:
        pn.register_dsl("bench", types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("0")))
    pn.register_op_override("bench", "aten", "sub.Tensor", "CPU", accept, impl)
    pn.register_op_override("bench", "aten", "mul.Tensor", "CPU", decline, impl)
    bare = torch.library.Library("aten", "IMPL", "CPU")
    bare.impl("div.Tensor", lambda self, other: self, "CPU")  # the impl alone, no router
    t = {
        "impl_direct": median_us(lambda: impl(A, B), number, repeat),
        "bare_impl": median_us(lambda: torch.div(A, B), number, repeat),
        "override": median_us(lambda: torch.sub(A, B), number, repeat),
        "fallback": median_us(lambda: torch.mul(A, B), number, repeat),
        "plain_aten": median_us(lambda: torch.add(A, B), number, repeat),
    }
    pn.disable_operations("mul")  # same op as the fallback figure, so the two compare
    t["disabled"] = median_us(lambda: torch.mul(A, B), number, repeat)
    pn.enable_operations("mul")

    def toggle():
        with pn.operations_disabled("sub"):
            pass

    t["toggle"] = median_us(toggle, number // 10, repeat)
    bare._destroy()
    return t


def in_tree(number: int, repeat: int) -> dict[str, float] | None:
    """The same measurements through torch's in-tree registry, on sibling ops (torch >= 2.13).

    python-native adopts torch's overrides into its own panel; ``native_bridge.standalone()``
    lets torch's registry route these ones itself, as it would without python-native.
    """
    try:
        import torch._native.registry as tn
    except ImportError:
        return None
    from python_native import native_bridge

    with native_bridge.standalone():
        return _in_tree_figures(tn, number, repeat)


def _in_tree_figures(tn, number: int, repeat: int) -> dict[str, float]:
    for op, cond in (("rsub.Tensor", accept), ("true_divide.Tensor", decline)):
        tn.register_op_override("bench", "aten", op, "CPU", cond, impl)
        tn._register_overrides_from_graph(op, "CPU", tn._graphs[(op, "CPU")])
    t = {
        "override": median_us(lambda: torch.rsub(A, B), number, repeat),
        "fallback": median_us(lambda: torch.true_divide(A, B), number, repeat),
    }

    def toggle():
        tn.deregister_op_overrides(disable_op_symbols=["rsub.Tensor"])
        tn.reenable_op_overrides(enable_op_symbols=["rsub.Tensor"])

    t["toggle"] = median_us(toggle, max(number // 100, 10), repeat)
    tn.deregister_op_overrides(disable_op_symbols=["rsub.Tensor"])
    t["disabled"] = median_us(lambda: torch.rsub(A, B), number, repeat)
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="calls per timed batch")
    parser.add_argument("--repeat", type=int, default=15, help="timed batches (the median is reported)")
    args = parser.parse_args(argv)

    o = ours(args.number, args.repeat)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device cpu; medians in microseconds")
    print(f"  plain aten call (add)              {o['plain_aten']:7.3f}")
    print(f"  impl called directly               {o['impl_direct']:7.3f}")
    print(f"  impl registered bare at CPU        {o['bare_impl']:7.3f}")
    router_cost = o["override"] - o["bare_impl"]
    e2e = o["override"] - o["impl_direct"]
    fallback = o["fallback"] - o["plain_aten"]
    print(f"python-native: override call {o['override']:.3f}: router cost {router_cost:.3f}, "
          f"end-to-end over direct impl {e2e:.3f}")
    print(f"python-native: fallback over plain aten {fallback:.3f}; disabled op {o['disabled']:.3f} "
          f"({o['disabled'] / o['plain_aten']:.2f}x plain aten, {o['disabled'] / o['fallback']:.2f}x a fallback)")
    print(f"python-native: operations_disabled enter+exit {o['toggle']:.3f}")

    t = in_tree(args.number, args.repeat)
    if t is None:
        print("torch._native is not in this torch: no in-tree comparison")
        return 0
    t_router = t["override"] - o["bare_impl"]
    t_e2e = t["override"] - o["impl_direct"]
    t_fallback = t["fallback"] - o["plain_aten"]
    print(f"torch._native: override call {t['override']:.3f}: router cost {t_router:.3f}, "
          f"end-to-end over direct impl {t_e2e:.3f}")
    print(f"torch._native: fallback over plain aten {t_fallback:.3f}; disabled op {t['disabled']:.3f}; "
          f"toggle {t['toggle']:.3f}")
    print("ratios (python-native / torch._native; lower is better):")
    print(f"  override router cost      {router_cost / t_router:6.3f}   (target <= 0.25)")
    print(f"  override end-to-end       {e2e / t_e2e:6.3f}")
    print(f"  fallback overhead         {fallback / t_fallback:6.3f}   (target <= 1.00)")
    print(f"  disabled op vs fallback   {o['disabled'] / o['fallback']:6.3f}   (target <= 1.00, ours vs ours)")
    print(f"  toggle                    {o['toggle'] / t['toggle']:6.3f}   (target <= 0.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
