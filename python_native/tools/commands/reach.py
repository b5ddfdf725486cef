"""``python -m python_native reach``: what the package reaches in a model, from one training step.

``--model NAME`` builds a tiny randomly initialised transformers model of that family from its
config (no download: hidden 64, 2 layers); ``--script user.py`` takes the user's own model from a
file that defines ``build()`` returning ``(model, inputs)``, ``inputs`` a tuple of positional
arguments or a dict of keyword arguments. The model is patched for the step (``--no-patch``: as
it is), and the report tables per module class the calls an override served, those that fell
back and why, and those a rule could take that computed outside the package.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path
from typing import Any

from python_native.tools.commands.usage import UsageError

HELP = "one training step of a model (a tiny built-in config, or your script's): what reaches an override, per module class"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from python_native.tools import tiny_models

    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default="llama", metavar="NAME",
                        help=f"a tiny model of this transformers family ({', '.join(tiny_models.FAMILIES)}, "
                             "or any model type transformers knows; default llama)")
    source.add_argument("--script", metavar="PATH", help="a Python file defining build() -> (model, inputs)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the tiny model's dtype (default float32)")
    parser.add_argument("--device", default=None, help="where the tiny model runs (default: cuda if available, else cpu)")
    parser.add_argument("--no-patch", action="store_true", help="report the model as it is, unpatched")
    parser.add_argument("--json", action="store_true", help="the report as JSON")


def _from_script(path: str) -> tuple[Any, tuple, dict]:
    namespace = runpy.run_path(path, run_name="__python_native_reach__")
    build = namespace.get("build")
    if not callable(build):
        raise UsageError(f"--script {path}: defines no build() function returning (model, inputs)")
    result = build()
    if not isinstance(result, tuple) or len(result) != 2:
        raise UsageError(f"--script {path}: build() must return (model, inputs), got {type(result).__name__}")
    model, inputs = result
    if isinstance(inputs, dict):
        return model, (), inputs
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {}


def _tiny(args: argparse.Namespace) -> tuple[Any, tuple, dict]:
    import torch

    from python_native.tools import tiny_models

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = tiny_models.build(args.model, dtype=getattr(torch, args.dtype)).to(device)
    except tiny_models.Unbuildable as e:
        raise UsageError(f"--model: {e}") from None
    return model, (), tiny_models.example_inputs(model)


def _unpatched_step_fails(model: Any, kwargs: dict) -> str | None:
    """Why transformers' own code cannot run one training step of ``model`` (None when it can):
    a tiny model whose step fails unpatched is refused, not blamed on the patch."""
    try:
        model(**kwargs).loss.backward()
    except Exception as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return f"{type(e).__name__}: {(lines or [''])[0][:200]}"
    finally:
        model.zero_grad(set_to_none=True)
    return None


def _check(args: argparse.Namespace) -> None:
    """The script, device and model family asked for, checked before any model is built."""
    import torch

    from python_native.tools import tiny_models

    if args.script is not None and not Path(args.script).expanduser().is_file():
        raise UsageError(f"--script {args.script}: no such file; give a Python file defining build()")
    if args.device is not None:
        try:
            torch.device(args.device)
        except RuntimeError as e:
            raise UsageError(f"--device {args.device!r}: {e}") from None
    if args.script is None:
        try:
            tiny_models.config(args.model)
        except (RuntimeError, ValueError) as e:  # tiny_models.Unbuildable included: the type refused, and why
            raise UsageError(f"--model: {e}") from None


def run(args: argparse.Namespace) -> int:
    import python_native as pn

    _check(args)
    model, inputs, kwargs = _from_script(args.script) if args.script else _tiny(args)
    try:
        report = pn.reach(model, *inputs, kwargs=kwargs, patch=not args.no_patch)
    except Exception:
        why = None if args.script else _unpatched_step_fails(model, kwargs)
        if why is None:
            raise
        raise UsageError(f"--model {args.model}: transformers' own code fails a training step of its tiny "
                         f"model, unpatched: {why}") from None
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2, default=str)
        print()
    else:
        print(report.patch)
        print()
        print(report)
    return 0
