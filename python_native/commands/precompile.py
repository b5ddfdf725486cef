"""``python -m python_native precompile``: build the compiled dispatch front and the CuTe DSL kernels.

The front (``python_native.front``) is built for the running torch and compiler into the user's
cache; ``import torch`` loads it from there from then on. Every CuTe DSL specialization the op
modules declare (op x dtype x size class) is compiled for ``--arch`` without a GPU, so the first
call on a GPU machine loads a binary instead of compiling. A second run finds everything in the
caches and says so (``"cached": true``).
"""

from __future__ import annotations

import argparse
import json
import os

HELP = "build the compiled dispatch front and the CuTe DSL kernels ahead of time (no GPU needed)"

TARGETS = ("all", "front", "cutedsl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsl", choices=TARGETS, default="all",
                        help="what to build: the compiled dispatch front, the CuTe DSL kernels, or both (default)")
    parser.add_argument("--arch", default="sm_90a", help="target GPU architecture, e.g. sm_90a (H100) or sm_80")
    parser.add_argument("--op", action="append", help="only this aten op (repeatable), e.g. _fused_rms_norm")
    parser.add_argument("--dtype", action="append", help="only this dtype (repeatable): float32, float16, bfloat16")
    parser.add_argument("--size-class", action="append", help="only this size class (repeatable): short, medium, long")
    parser.add_argument("--cache-dir", help="cache folder (default: $PYTHON_NATIVE_CACHE_DIR or the user cache dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _selected(entries: list, args: argparse.Namespace) -> list:
    def keep(op: str, cls: str, variant) -> bool:
        return (
            (not args.op or op in args.op)
            and (not args.dtype or variant.dtype in args.dtype)
            and (not args.size_class or cls in args.size_class)
        )

    return [e for e in entries if keep(*e)]


def _build_front(args: argparse.Namespace) -> tuple[dict, int]:
    from python_native import front

    try:
        result = front.ensure_built()
    except Exception as e:  # the compiler's message is the report
        result, failed = {"error": f"{type(e).__name__}: {e}"}, 1
    else:
        failed = 0
    if not args.json:
        state = result.get("error") or (
            f"cached at {result['library']}" if result["cached"] else f"built in {result['seconds']} s: {result['library']}"
        )
        print(f"compiled dispatch front: {state}")
    return result, failed


def run(args: argparse.Namespace) -> int:
    front, front_failed = _build_front(args) if args.dsl in ("all", "front") else (None, 0)
    if args.dsl == "front":
        if args.json:
            print(json.dumps({"front": front}, indent=2))
        return front_failed
    from python_native_dsls import cutedsl

    problem = cutedsl._install_problem()
    if problem is not None:
        note = f"CuTe DSL kernels skipped: {problem}; install it with `pip install python-native[cutedsl]`"
        if args.json:
            print(json.dumps({"front": front, "cutedsl": note}, indent=2))
        else:
            print(note)
        return 1 if args.dsl == "cutedsl" or front_failed else 0
    # Compiling needs no device; hiding devices keeps the compiler from probing one.
    os.environ.setdefault("CUTE_DSL_ARCH", args.arch)
    from python_native.kernel_cache import KernelCache
    from python_native_dsls.cutedsl.ops import precompile_variants

    entries = _selected(precompile_variants(), args)
    if not entries:
        print("precompile: no specialization matches the given --op/--dtype/--size-class filters")
        return 1
    from python_native_dsls.cutedsl.kernels import compiler

    cache = KernelCache(args.cache_dir) if args.cache_dir else KernelCache()
    results, failed = [], 0
    for op, cls, variant in entries:
        row = {"op": op, "size_class": cls, **variant.describe()}
        try:
            _, cached, ms = compiler.build(variant, args.arch, cache)
            row.update(cached=cached, ms=round(ms, 1))
        except Exception as exc:  # report every kernel, then fail
            failed += 1
            row.update(cached=False, error=f"{type(exc).__name__}: {exc}")
        results.append(row)
        if not args.json:
            state = row.get("error") or ("cached" if row["cached"] else "compiled")
            flags = ",".join(sorted(variant.flags)) or "-"
            print(f"{op:28} {variant.dtype:>8}->{variant.out_dtype:<8} {cls:6} {flags:11} {row.get('ms', 0):8.1f} ms  {state}")
    summary = {
        "front": front,
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
    return 1 if failed or front_failed else 0
