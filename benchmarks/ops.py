"""Triton overrides against aten per op, dtype and shape: ``python -m python_native bench`` as a script.

The benchmark lives in ``python_native.tools.bench`` so that users run it on their own GPU without the
repository; this script keeps the old entry point. Same options, e.g.
``PYTHONPATH=. python benchmarks/ops.py --dtypes bfloat16 --json``; without a GPU,
``PYTHON_NATIVE_TRITON_INTERPRET=1 python benchmarks/ops.py --quick`` runs tiny shapes through
Triton's interpreter (proof of the path end to end, not of speed).
"""

from __future__ import annotations

import sys

from python_native.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
