"""What ``import torch`` pays for python-native: the package's cumulative import time, median of fresh processes.

Run: ``python benchmarks/import_cost.py`` (CPU is enough). Each round starts fresh interpreters
with ``python -X importtime -c "import torch"``, alternating with python-native mounted and without
it (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: torch calls no ``torch.backends`` entry point), and prints
the medians over the rounds of:

- *python_native cumulative*: the package's own line of the import-time tree (the figure the budget
  is for; it includes ``torch._native``, which python-native imports to adopt its overrides and
  which torch imports right after the entry points anyway: *less torch._native* takes it out);
- *torch cumulative*, with python-native and without it, and their difference (noisier: every
  module of torch varies from run to run).

Every process reads torch's and the standard library's bytecode from a temporary
``PYTHONPYCACHEPREFIX`` written by a warm-up process without python-native; python-native's own
modules are compiled from source in each process, as on a machine with ``PYTHONDONTWRITEBYTECODE=1``
and no ``__pycache__`` (folders left in the checkout are ignored). ``--bytecode`` warms them too, as
an installed package has them. ``--pythonpath DIR`` measures another checkout (put first on
``PYTHONPATH``; it needs ``python_native_dsls`` there, e.g. a link to its ``dsls``). ``--json``
prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)")


def import_times(env: dict[str, str]) -> dict[str, float]:
    """Cumulative seconds of torch, python_native and the torch._native import inside it, in one fresh process."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch"], env=env,
                         capture_output=True, text=True, check=True).stderr
    rows = [(int(m[1]) / 1e6, len(m[2]), m[3]) for m in map(LINE.match, out.splitlines()) if m]
    found = {"torch": next(t for t, _, name in rows if name == "torch"), "python_native": 0.0, "torch._native": 0.0}
    for i, (seconds, depth, name) in enumerate(rows):
        if name != "python_native":
            continue
        found["python_native"] = seconds
        j = i - 1  # children are printed before their parent, deeper
        while j >= 0 and rows[j][1] > depth:
            child = rows[j][1] == depth + 2
            if child and (rows[j][2] == "torch._native" or rows[j][2].startswith("torch._native.")):
                found["torch._native"] += rows[j][0]
            j -= 1
    return found


def measure(rounds: int, bytecode: bool, pythonpath: str | None = None) -> dict[str, float]:
    base = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath:
        base["PYTHONPATH"] = os.pathsep.join(filter(None, (pythonpath, base.get("PYTHONPATH"))))
    with tempfile.TemporaryDirectory() as cache:
        base["PYTHONPYCACHEPREFIX"] = cache
        writing = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
        warm = "import torch, packaging.version, platformdirs"  # what python-native imports outside itself
        subprocess.run([sys.executable, "-c", warm], env={**writing, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, check=True)
        if bytecode:
            import_times(writing)
        with_pn, without = [], []
        for _ in range(rounds):
            with_pn.append(import_times(base))
            without.append(import_times({**base, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}))
    med = statistics.median
    return {
        "rounds": rounds,
        "bytecode": bytecode,
        "python_native_cumulative_s": med(r["python_native"] for r in with_pn),
        "python_native_less_torch_native_s": med(r["python_native"] - r["torch._native"] for r in with_pn),
        "torch_with_python_native_s": med(r["torch"] for r in with_pn),
        "torch_without_python_native_s": med(r["torch"] for r in without),
        "torch_difference_s": med(a["torch"] - b["torch"] for a, b in zip(with_pn, without, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes per configuration (default 5)")
    parser.add_argument("--bytecode", action="store_true", help="with cached bytecode, as an installed package")
    parser.add_argument("--pythonpath", help="measure the checkout at this folder instead of the installed one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = measure(args.rounds, args.bytecode, args.pythonpath)
    if args.json:
        print(json.dumps(found, indent=2))
        return
    how = "python-native from cached bytecode" if args.bytecode else "python-native compiled from source"
    print(f"import torch, median of {args.rounds} fresh processes ({how}):")
    print(f"  python_native cumulative           {found['python_native_cumulative_s']:.3f} s")
    print(f"  python_native less torch._native   {found['python_native_less_torch_native_s']:.3f} s")
    print(f"  torch with python-native           {found['torch_with_python_native_s']:.3f} s")
    print(f"  torch without (autoload off)       {found['torch_without_python_native_s']:.3f} s")
    print(f"  difference                         {found['torch_difference_s']:.3f} s")


if __name__ == "__main__":
    main()
