"""``python -m python_native precompile``: build the compiled dispatch front and the CuTe DSL kernels.

The front (``python_native.features.front``) is built for the running torch and compiler into the user's
cache; ``import torch`` loads it from there from then on. Every CuTe DSL specialization the op
modules declare (op x dtype x size class) is compiled for ``--arch`` without a GPU, so the first
call on a GPU machine loads a binary instead of compiling. A second run finds everything in the
caches and says so (``"cached": true``). ``--arch``, ``--op``, ``--dtype`` and ``--size-class``
are checked before anything is built; a bad value is answered in one line listing what is allowed.
``--cache-dir DIR`` holds both: the kernels in DIR, the front in DIR/front, as
``PYTHON_NATIVE_CACHE_DIR=DIR`` would place them (later processes find them with that variable set).
Everything is written under the trust rules (``python_native.foundations.trust``): into folders
that are the user's (or root's) and writable by nobody else, through fresh temporary files and
renames that follow no planted link, each with its manifest. A cache folder that fails the rules
is refused before anything is compiled, and so is a run under ``PYTHON_NATIVE_DISABLE=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from python_native.foundations import env
from python_native.tools.commands.names import for_ops, listed
from python_native.tools.commands.usage import UsageError, one_of, writable_folder

HELP = "build the compiled dispatch front and the CuTe DSL kernels ahead of time (no GPU needed)"

TARGETS = ("all", "front", "cutedsl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsl", choices=TARGETS, default="all",
                        help="what to build: the compiled dispatch front, the CuTe DSL kernels, or both (default)")
    parser.add_argument("--arch", default="sm_90a", help="target GPU architecture, e.g. sm_90a (H100) or sm_80")
    parser.add_argument("--op", "--ops", dest="op", action="append", metavar="NAME",
                        help="only this op's kernels (repeatable, or a comma list): a public name (rms_norm) or an aten "
                             "forward's name (_fused_rms_norm) covers the forward and its backward, a backward's name "
                             "just that")
    parser.add_argument("--dtype", action="append", help="only this dtype (repeatable, or a comma list): float32, float16, bfloat16")
    parser.add_argument("--size-class", action="append",
                        help="only this size class (repeatable, or a comma list): short, medium, long")
    parser.add_argument("--cache-dir", help="cache folder of every build: kernels in it, the front in its front/ "
                        "(default: $PYTHON_NATIVE_CACHE_DIR or the user cache dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _selected(entries: list, args: argparse.Namespace) -> list:
    def keep(op: str, cls: str, specialization) -> bool:
        return (
            (not args.op or op in args.op)
            and (not args.dtype or specialization.dtype in args.dtype)
            and (not args.size_class or cls in args.size_class)
        )

    return [e for e in entries if keep(*e)]


def _build_front(args: argparse.Namespace) -> tuple[dict, int]:
    from python_native.features import front

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
        if args.cache_dir and not failed:
            print(f"  (processes use it with {env.CACHE_DIR[0]}={args.cache_dir} set)")
    return result, failed


def _kernel_entries(args: argparse.Namespace) -> list | None:
    """The CuTe DSL specializations to build (None when CuTe DSL is not installed); ``UsageError``
    naming a bad option."""
    from python_native_dsls import cutedsl

    if cutedsl._install_problem() is not None:
        return None
    # Compiling needs no device; hiding devices keeps the compiler from probing one.
    os.environ.setdefault("CUTE_DSL_ARCH", args.arch)
    from python_native_dsls.cutedsl.kernels import compiler
    from python_native_dsls.cutedsl.ops import precompile_specializations

    entries = precompile_specializations()
    one_of("--arch", [args.arch], compiler.known_archs())
    args.op = for_ops("--op", [op for op, _, _ in entries], "CuTe DSL specialization").resolve(args.op)
    one_of("--dtype", args.dtype, sorted({v.dtype for _, _, v in entries}))
    one_of("--size-class", args.size_class, list(dict.fromkeys(cls for _, cls, _ in entries)))
    entries = _selected(entries, args)
    if not entries:
        raise UsageError("no specialization matches the given --op/--dtype/--size-class filters together")
    return entries


def _check(args: argparse.Namespace) -> None:
    """Comma lists split; ``--cache-dir`` checked and put in force for every builder."""
    args.dtype = listed(args.dtype) or None
    args.size_class = listed(args.size_class) or None
    chosen = [option for option, value in (("--op", args.op), ("--dtype", args.dtype), ("--size-class", args.size_class))
              if value]
    if args.dsl == "front" and chosen:
        raise UsageError(f"{', '.join(chosen)} choose CuTe DSL kernels, and --dsl front builds none; "
                         "use --dsl cutedsl or --dsl all")
    if args.cache_dir is not None:
        args.cache_dir = os.path.abspath(writable_folder("--cache-dir", args.cache_dir))
        variable = env.CACHE_DIR[0]
        os.environ[variable] = args.cache_dir  # where the front's build and the kernel cache look


def _refused(args: argparse.Namespace) -> str | None:
    """Why nothing may be built here: the off switch, or a kernel cache folder that fails the trust rules."""
    from python_native.foundations import env, trust
    from python_native.foundations.kernel_cache import KernelCache

    if env.overrides_disabled():
        return f"{env.DISABLE_ALL[0]} is set: python-native builds and loads nothing in this process; unset it to precompile"
    if args.dsl in ("all", "cutedsl"):
        cache = KernelCache(args.cache_dir) if args.cache_dir else KernelCache()
        try:
            cache.trusted_root()
        except trust.Untrusted as e:
            return f"the kernel cache folder {cache.root} cannot be used: {e.path} {e.why} ({e.remedy})"
    return None


def run(args: argparse.Namespace) -> int:
    _check(args)
    refused = _refused(args)
    if refused:
        raise UsageError(refused)
    entries: list | None = []
    if args.dsl in ("all", "cutedsl"):
        entries = _kernel_entries(args)
    front, front_failed = _build_front(args) if args.dsl in ("all", "front") else (None, 0)
    if args.dsl == "front":
        if args.json:
            print(json.dumps({"front": front}, indent=2))
        return front_failed
    if entries is None:
        from python_native_dsls import cutedsl

        note = (f"CuTe DSL kernels skipped: {cutedsl._install_problem()}; "
                "install it with `pip install python-native[cutedsl]`")
        if args.json:
            print(json.dumps({"front": front, "cutedsl": note}, indent=2))
        else:
            print(note)
        return 1 if args.dsl == "cutedsl" or front_failed else 0
    summary, failed = _build_kernels(entries, args)
    summary = {"front": front, **summary}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['compiled']} compiled, {summary['cached']} reused from {summary['cache_dir']}, {failed} failed")
    return 1 if failed or front_failed else 0


def _build_kernels(entries: list, args: argparse.Namespace) -> tuple[dict, int]:
    from python_native.foundations.kernel_cache import KernelCache
    from python_native.tools.bench.progress import Progress
    from python_native_dsls.cutedsl.kernels import compiler

    cache = KernelCache(args.cache_dir) if args.cache_dir else KernelCache()
    results, failed = [], 0
    stream = sys.stderr if args.json else sys.stdout
    with Progress(len(entries), f"precompile {args.arch}", stream=stream, quiet=args.json) as progress:
        for op, cls, specialization in entries:
            row = {"op": op, "size_class": cls, **specialization.describe()}
            try:
                _, cached, ms = compiler.build(specialization, args.arch, cache)
                row.update(cached=cached, ms=round(ms, 1))
            except Exception as exc:  # report every kernel, then fail
                failed += 1
                row.update(cached=False, error=f"{type(exc).__name__}: {exc}")
            results.append(row)
            state = row.get("error") or ("cached" if row["cached"] else "compiled")
            flags = ",".join(sorted(specialization.flags)) or "-"
            progress.step(f"{op:28} {specialization.dtype:>8}->{specialization.out_dtype:<8} {cls:6} {flags:11} "
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
    return summary, failed
