"""``python -m python_native verify``: check each installed override against aten on this machine."""

from __future__ import annotations

import argparse

HELP = "check every installed override against aten (forward and backward, each dtype) and exit non-zero on a mismatch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--op", metavar="NAME", help="check only this op's override (and its backward's), e.g. _softmax, or sum for sum.dim_IntList")
    parser.add_argument("--max-samples", type=int, default=8, metavar="N",
                        help="at most N samples per op and dtype (default 8; 0 for no limit)")


def run(args: argparse.Namespace) -> int:
    if args.max_samples < 0:
        raise SystemExit(f"--max-samples must be >= 0 (0 for no limit), got {args.max_samples}")
    from python_native.tools import verify

    try:
        report = verify.verify(op=args.op, max_samples=args.max_samples or None)
    except ValueError as e:
        raise SystemExit(f"verify: {e}") from None
    print(verify.to_json(report) if args.json else verify.render(report))
    return 0 if report["ok"] else 1
