"""``TORCH_LOGS=+python_native``: registration diagnostics and compile events through torch's logging.

Each case is a fresh process, since ``TORCH_LOGS`` is read while ``import torch`` runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SOFTMAX = "import torch; torch.softmax(torch.randn(4, 8), -1)"


def _torch_reads_logs_after_autoload() -> bool:
    """Whether ``import torch`` parses ``TORCH_LOGS`` after it autoloads its backends (torch 2.13 on).

    Before, it parses them first: a name only a backend registers (``python_native_compile``)
    is refused while ``import torch`` runs, whatever the backend does.
    """
    import torch

    source = Path(torch.__file__).read_text(encoding="utf-8")
    autoload, parse = source.rfind("_import_device_backends()"), source.rfind("_logging._init_logs()")
    return 0 <= autoload < parse


LOGS_AFTER_AUTOLOAD = _torch_reads_logs_after_autoload()


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
    environ.update({"PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", **env})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def ours(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if "python_native" in line]


def test_plus_python_native_shows_every_registration_line():
    lines = "\n".join(ours(run("import torch", TORCH_LOGS="+python_native")))
    assert "PYTHON_NATIVE_TRITON_INTERPRET=1 in force" in lines
    assert "custom op python_native::linear_cross_entropy.forward defined (reference)" in lines
    assert "triton override of aten::_softmax installed at CPU" in lines  # per override: DEBUG
    assert "triton override of python_native::linear_cross_entropy.backward installed at CPU" in lines
    assert "python_native: triton installed" in lines and "overrides at CPU" in lines


def test_info_level_shows_the_summary_without_per_override_lines():
    lines = "\n".join(ours(run("import torch", TORCH_LOGS="python_native")))
    assert "python_native: triton installed" in lines
    assert "override of aten::_softmax installed" not in lines and "custom op" not in lines


def test_the_package_imported_before_torch_registers_its_names_in_time():
    """``import python_native`` imports torch, which autoloads the half-imported package itself.

    A torch that parses ``TORCH_LOGS`` before autoloading takes ``+python_native`` as a module name
    (as documented); ``python_native_compile`` it cannot know yet."""
    setting = "+python_native,python_native_compile" if LOGS_AFTER_AUTOLOAD else "+python_native"
    lines = "\n".join(ours(run("import python_native", TORCH_LOGS=setting)))
    assert "python_native: triton installed" in lines


@pytest.mark.slow
def test_nothing_new_is_printed_by_default():
    with_us = run(SOFTMAX)
    without_us = run(SOFTMAX, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert (with_us.stdout, with_us.stderr) == (without_us.stdout, without_us.stderr) == ("", "")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["env", "set_logs"])
def test_compile_events_name_op_variant_key_and_seconds(how):
    if how == "env" and not LOGS_AFTER_AUTOLOAD:
        pytest.skip("this torch parses TORCH_LOGS before it autoloads backends (before 2.13): "
                    "python_native_compile is not registered yet; set_logs switches it on")
    if how == "env":
        proc = run(SOFTMAX + "; torch.softmax(torch.randn(4, 8), -1)", TORCH_LOGS="python_native_compile")
    else:
        proc = run("import torch; torch._logging.set_logs(modules={\"python_native_compile\": True}); " + SOFTMAX)
    lines = ours(proc)
    assert len(lines) == 1, proc.stderr  # the second call reuses the first launch's specialization; no registration lines
    assert "[__python_native_compile] python_native: triton compiled _softmax_fwd_kernel for op _softmax, " \
           "_log_softmax (variant default) at CPU in " in lines[0]
    assert " s (LOG=False, BLOCK_M=" in lines[0] and lines[0].endswith("interpreted)")
