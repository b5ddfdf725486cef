"""``python -m python_native inspect``: what each Triton kernel costs on a GPU, read without one.

For every benchmark row (``bench``'s LLM rows and grid, per dtype) the overrides' own conds and
impls plan the launches; each kernel specialization is compiled ahead of time for ``--arch`` (registers,
spills, shared memory, warps, occupancy, waves) and its global-memory bytes are counted in Triton's
interpreter against the op's minimum. ``--check`` exits non-zero on a finding that
``python_native/tools/kernel_report/exceptions.py`` does not excuse.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from python_native.tools.commands.names import for_rows, listed
from python_native.tools.commands.usage import one_of

HELP = "registers, spills, occupancy, waves and bytes per call of every Triton kernel at the benchmark shapes, " \
       "compiled for a GPU target without one"

DTYPE_NAMES = ("float32", "float16", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="sm_90a", help="target: sm_90a (H100, default), sm_80 (A100), sm_100a (B200)")
    parser.add_argument("--op", "--ops", dest="op", action="append", metavar="NAME",
                        help="only this benchmark row (repeatable, or a comma list), e.g. softmax, or any op name the "
                             "panel takes (_softmax, bmm), selecting the rows that reach it")
    parser.add_argument("--dtype", "--dtypes", dest="dtype", action="append", metavar="D",
                        help="only this dtype (repeatable, or a comma list): " + ", ".join(DTYPE_NAMES))
    parser.add_argument("--quick", action="store_true", help="bfloat16 only (unless --dtype says otherwise)")
    parser.add_argument("--no-bytes", action="store_true", help="skip counting bytes in the interpreter (compile figures only)")
    parser.add_argument("--check", action="store_true", help="exit 1 on a finding the exceptions file does not excuse")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from python_native.tools.bench import rows
    from python_native.tools.kernel_report import arch

    args.dtype = listed(args.dtype) or None
    one_of("--arch", [args.arch], tuple(arch.ARCHS))
    one_of("--dtype", args.dtype, DTYPE_NAMES)
    args.op = for_rows("--op", rows.OPS).resolve(args.op)
    from python_native.foundations import env

    if not (env.triton_interpret() and env.triton_runtime_interprets()):
        # Bytes are counted by running programs in Triton's interpreter, which Triton picks as the
        # kernels are defined: the command runs again in a process that has it on from the start.
        interpreting = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
        command = [sys.executable, "-m", "python_native", "inspect", *_argv(args)]
        return subprocess.run(command, env=interpreting, check=False).returncode
    import torch

    from python_native.tools.kernel_report import checks, collect, render

    names = args.dtype or (["bfloat16"] if args.quick else list(DTYPE_NAMES))
    progress = None if args.json else (lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    report = collect.collect(args.arch, ops=args.op, dtypes=[getattr(torch, n) for n in names],
                             with_traffic=not args.no_bytes, progress=progress)
    findings = checks.check(report)
    if args.json:
        report["findings"] = [{**vars(f), "excused": vars(f.excused) if f.excused else None} for f in findings]
        print(json.dumps(report))
    else:
        print(render.render(report, findings))
    return 1 if args.check and checks.open_findings(findings) else 0


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line of ``args`` again."""
    argv = ["--arch", args.arch]
    for option, values in (("--op", args.op), ("--dtype", args.dtype)):
        for value in values or ():
            argv += [option, value]
    flags = {"--quick": args.quick, "--no-bytes": args.no_bytes, "--check": args.check, "--json": args.json}
    return argv + [flag for flag, on in flags.items() if on]
