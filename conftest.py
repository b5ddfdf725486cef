"""Test-session set-up: run Triton kernels through its interpreter on this CPU-only machine.

Set before torch is imported, so that the triton backend installs its overrides at the CPU key.
"""

import os

os.environ.setdefault("PYTHON_NATIVE_TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")
