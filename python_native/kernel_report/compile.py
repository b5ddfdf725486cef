"""Ahead-of-time compiles of the recorded launches, one per distinct compiled variant.

A variant is what Triton compiles a launch into: the kernel, the dtype and 16-byte alignment of
each pointer, what it specializes each int on (equal to 1, a multiple of 16), the constexprs and
the warps (``launch._spec_key`` is that key). Variants compile in a worker process
(``compile_worker``) with the interpreter off; results are remembered per process and Triton's
own cache dir keeps the binaries, so a second run only reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch

from python_native.kernel_report.launches import Launch

_results: dict[tuple, dict] = {}


def variant_key(launch: Launch, arch: str) -> tuple:
    from python_native_dsls.triton.kernels.launch import _spec_key

    fn = getattr(launch.kernel, "fn", launch.kernel)
    return (arch, fn.__module__, fn.__name__, _spec_key(launch.args), tuple(sorted(launch.constexprs.items())),
            launch.num_warps)


def request(launch: Launch) -> dict:
    fn = getattr(launch.kernel, "fn", launch.kernel)

    def arg(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return {"tensor": str(a.dtype).removeprefix("torch."), "aligned": a.data_ptr() % 16 == 0}
        return a

    return {"module": fn.__module__, "kernel": fn.__name__, "args": [arg(a) for a in launch.args],
            "constexprs": launch.constexprs, "num_warps": launch.num_warps}


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PYTHON_NATIVE_TRITON_INTERPRET": "0", "TRITON_INTERPRET": "0", "PYTHON_NATIVE_DISABLE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    })
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its notice
    return env


def compile_all(requests_by_key: dict[tuple, dict], capability: int) -> dict[tuple, dict]:
    """Figures of every variant (``variant_key`` -> ``request``): compiled once per process."""
    pending = {key: req for key, req in requests_by_key.items() if key not in _results}
    if pending:
        requests = list(pending.values())
        done = subprocess.run(
            [sys.executable, "-m", "python_native.kernel_report.compile_worker", str(capability)],
            input=json.dumps(requests), capture_output=True, text=True, env=_worker_env(), check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the compile worker failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        for key, result in zip(pending, json.loads(done.stdout), strict=True):
            _results[key] = result
    return {key: _results[key] for key in requests_by_key}
