"""``python -m python_native verify``: check each installed override against aten on this machine."""

from __future__ import annotations

import argparse

from python_native.tools.commands.usage import at_least

HELP = "check every installed override against aten (forward and backward, each dtype) and exit non-zero on a mismatch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--op", "--ops", dest="op", action="append", metavar="NAME",
                        help="check only this op's overrides (repeatable, or a comma list): a public name (softmax, "
                             "layer_norm) or an aten forward's name (_softmax) checks the forward and its backward, a "
                             "backward's name just that, a bare name every overload (sum for sum.dim_IntList)")
    parser.add_argument("--max-samples", type=int, default=8, metavar="N",
                        help="at most N samples per op and dtype (default 8; 0 for no limit)")


def run(args: argparse.Namespace) -> int:
    at_least("--max-samples", args.max_samples, 0, "0 for no limit")
    import python_native as pn
    from python_native.panel import snapshot
    from python_native.tools import verify
    from python_native.tools.commands.names import for_ops

    installed = [o.op for o in pn.overrides() if o.derived_from is None]
    ops = for_ops("--op", installed, "installed override", snapshot.interpreter_hint() or "").resolve(args.op)
    report = verify.verify(op=ops, max_samples=args.max_samples or None)
    print(verify.to_json(report) if args.json else verify.render(report))
    return 0 if report["ok"] else 1
