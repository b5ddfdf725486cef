"""Test-session set-up: pick where the Triton kernels run before torch is imported.

Importing torch installs python-native's overrides at the key the mode selects, so the choice is
made here, first: an explicit ``PYTHON_NATIVE_TRITON_INTERPRET`` / ``TRITON_INTERPRET`` wins;
otherwise the kernels run on CUDA when a CUDA build of torch sees a GPU, and through Triton's
interpreter at the CPU key everywhere else.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

_INTERPRET_VARS = ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")


def _torch_is_cuda_build() -> bool:
    """Read torch's build metadata without importing torch (which would install the overrides)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return False
    match = re.search(r"^cuda\b[^=\n]*=\s*(.+)$", text, re.MULTILINE)
    return match is not None and match.group(1).strip() != "None"


def _cuda_available() -> bool:
    """``torch.cuda.is_available()`` asked in a child process, only for CUDA builds of torch."""
    if not _torch_is_cuda_build():
        return False
    env = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"}
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, timeout=300, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _choose_triton_mode() -> None:
    explicit = next((os.environ[name] for name in _INTERPRET_VARS if name in os.environ), None)
    mode = explicit if explicit is not None else ("0" if _cuda_available() else "1")
    for name in _INTERPRET_VARS:
        os.environ.setdefault(name, mode)
    if mode == "0":
        # On a GPU the shipped table would hand the suite's small shapes to aten: the tests are about
        # what the kernels compute, so no gate unless a test installs one (calibration tests do).
        os.environ.setdefault("PYTHON_NATIVE_CALIBRATION", "off")


_choose_triton_mode()


def _isolate_user_cache() -> None:
    """The suite reads no calibration table a developer's own ``bench --calibrate`` left in their
    cache (it would gate or drop the overrides under test): a fresh cache home for the session.
    The kernel cache keeps its usual folder."""
    import tempfile

    home = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    os.environ.setdefault("PYTHON_NATIVE_CACHE_DIR", os.path.join(home, "python-native", "kernels"))
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="python-native-test-cache-")


_isolate_user_cache()
# No test process starts a build of the compiled front in the background (the tests that are about
# it turn it on for their own child processes, with their own cache folder).
os.environ.setdefault("PYTHON_NATIVE_BACKGROUND_BUILD", "0")
# The suite runs every kernel, also those no GPU has timed yet (which stay off at GPU keys otherwise).
os.environ.setdefault("PYTHON_NATIVE_UNMEASURED", "1")
