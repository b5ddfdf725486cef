"""``python -m python_native precompile``: build the CuTe DSL kernels into the on-disk kernel cache.

Every specialization the op modules declare (op x dtype x size class) is compiled for ``--arch``
without a GPU, so the first call on a GPU machine loads a binary instead of compiling. A second
run finds every entry in the cache and says so (``"cached": true``). ``--arch``, ``--op``,
``--dtype`` and ``--size-class`` are checked before anything compiles; a bad value is answered
in one line listing what is allowed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

HELP = "compile the CuTe DSL kernels ahead of time into the on-disk kernel cache (no GPU needed)"

DSLS = ("cutedsl",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsl", choices=DSLS, default="cutedsl", help="the DSL whose kernels to build")
    parser.add_argument("--arch", default="sm_90a", help="target GPU architecture, e.g. sm_90a (H100) or sm_80")
    parser.add_argument("--op", action="append", help="only this aten op (repeatable), e.g. _fused_rms_norm")
    parser.add_argument("--dtype", action="append", help="only this dtype (repeatable): float32, float16, bfloat16")
    parser.add_argument("--size-class", action="append", help="only this size class (repeatable): short, medium, long")
    parser.add_argument("--cache-dir", help="cache folder (default: $PYTHON_NATIVE_CACHE_DIR or the user cache dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _bad(option: str, values: list[str] | None, allowed: list[str]) -> str | None:
    """One line naming the values of ``option`` that are not ``allowed``, with close matches; None when all are."""
    wrong = [v for v in values or () if v not in allowed]
    if not wrong or not allowed:
        return None
    close = sorted({c for v in wrong for c in difflib.get_close_matches(v, allowed, n=2, cutoff=0.6)})
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"{option} {', '.join(map(repr, wrong))} unknown; {hint}allowed: {', '.join(allowed)}"


def _selected(entries: list, args: argparse.Namespace) -> list:
    def keep(op: str, cls: str, variant) -> bool:
        return (
            (not args.op or op in args.op)
            and (not args.dtype or variant.dtype in args.dtype)
            and (not args.size_class or cls in args.size_class)
        )

    return [e for e in entries if keep(*e)]


def _fail(message: str) -> int:
    print(f"precompile: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from python_native_dsls import cutedsl

    problem = cutedsl._install_problem()
    if problem is not None:
        print(f"precompile: {problem}; install it with `pip install python-native[cutedsl]`")
        return 1
    # Compiling needs no device; hiding devices keeps the compiler from probing one.
    os.environ.setdefault("CUTE_DSL_ARCH", args.arch)
    from python_native_dsls.cutedsl.kernels import compiler
    from python_native_dsls.cutedsl.ops import precompile_variants

    entries = precompile_variants()
    for option, values, allowed in (
        ("--arch", [args.arch], compiler.known_archs()),
        ("--op", args.op, sorted({op for op, _, _ in entries})),
        ("--dtype", args.dtype, sorted({v.dtype for _, _, v in entries})),
        ("--size-class", args.size_class, list(dict.fromkeys(cls for _, cls, _ in entries))),
    ):
        bad = _bad(option, values, allowed)
        if bad:
            return _fail(bad)
    entries = _selected(entries, args)
    if not entries:
        return _fail("no specialization matches the given --op/--dtype/--size-class filters together")
    return _build(entries, args, compiler)


def _build(entries: list, args: argparse.Namespace, compiler) -> int:
    from python_native.commands.progress import Progress
    from python_native.kernel_cache import KernelCache

    cache = KernelCache(args.cache_dir) if args.cache_dir else KernelCache()
    results, failed = [], 0
    stream = sys.stderr if args.json else sys.stdout
    with Progress(len(entries), f"precompile {args.arch}", stream=stream, quiet=args.json) as progress:
        for op, cls, variant in entries:
            row = {"op": op, "size_class": cls, **variant.describe()}
            try:
                _, cached, ms = compiler.build(variant, args.arch, cache)
                row.update(cached=cached, ms=round(ms, 1))
            except Exception as exc:  # report every kernel, then fail
                failed += 1
                row.update(cached=False, error=f"{type(exc).__name__}: {exc}")
            results.append(row)
            state = row.get("error") or ("cached" if row["cached"] else "compiled")
            flags = ",".join(sorted(variant.flags)) or "-"
            progress.step(f"{op:28} {variant.dtype:>8}->{variant.out_dtype:<8} {cls:6} {flags:11} "
                          f"{row.get('ms', 0):8.1f} ms  {state}")
    summary = {
        "dsl": args.dsl,
        "arch": args.arch,
        "cache_dir": str(cache.root),
        "kernels": results,
        "compiled": sum(1 for r in results if not r["cached"] and "error" not in r),
        "cached": sum(1 for r in results if r["cached"]),
        "failed": failed,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['compiled']} compiled, {summary['cached']} reused from {summary['cache_dir']}, {failed} failed")
    return 1 if failed else 0
