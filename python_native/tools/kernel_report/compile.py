"""Ahead-of-time compiles of the recorded launches, one per distinct compiled specialization.

A specialization is what Triton compiles a launch into: the kernel, the dtype and 16-byte alignment of
each pointer, what it specializes each int on (equal to 1, a multiple of 16), the constexprs and
the warps (``launch.spec_key`` is that key). Specializations compile in a worker process
(``compile_worker``) with the interpreter off; results are remembered per process and Triton's
own cache dir keeps the binaries, so a second run only reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import torch

from python_native.foundations import safe_write
from python_native.tools.kernel_report.launches import Launch

_results: dict[tuple, dict] = {}


def specialization_key(launch: Launch, arch: str) -> tuple:
    from python_native_dsls.triton.kernels.launch import spec_key

    fn = getattr(launch.kernel, "fn", launch.kernel)
    return (arch, fn.__module__, fn.__name__, spec_key(launch.args), tuple(sorted(launch.constexprs.items())),
            launch.num_warps)


def request(launch: Launch) -> dict:
    fn = getattr(launch.kernel, "fn", launch.kernel)

    def arg(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return {"tensor": str(a.dtype).removeprefix("torch."), "aligned": a.data_ptr() % 16 == 0}
        return a

    def constexpr(v: Any) -> Any:
        name = getattr(v, "primitive_bitwidth", None) and getattr(v, "name", None)
        return {"tl_dtype": name} if name else v  # a Triton dtype (reductions' accumulator and cast types)

    return {"module": fn.__module__, "kernel": fn.__name__, "args": [arg(a) for a in launch.args],
            "constexprs": {k: constexpr(v) for k, v in launch.constexprs.items()}, "num_warps": launch.num_warps}


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PYTHON_NATIVE_TRITON_INTERPRET": "0", "TRITON_INTERPRET": "0", "PYTHON_NATIVE_DISABLE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    })
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its notice
    return env


def compile_all(requests_by_key: dict[tuple, dict], capability: int) -> dict[tuple, dict]:
    """Figures of every specialization (``specialization_key`` -> ``request``): compiled once per
    process, the specializations shared out over one worker per CPU core."""
    pending = [(key, req) for key, req in requests_by_key.items() if key not in _results]
    workers = max(1, min(os.cpu_count() or 1, 8, len(pending)))
    shares = [share for share in (pending[i::workers] for i in range(workers)) if share]
    with tempfile.TemporaryDirectory() as folder:
        procs = []
        for i, share in enumerate(shares):
            path = os.path.join(folder, str(i))
            safe_write.write(f"{path}.in", json.dumps([req for _, req in share]), create=False)
            with open(f"{path}.in") as stdin, os.fdopen(safe_write.open_fresh(f"{path}.out"), "w") as stdout, \
                    os.fdopen(safe_write.open_fresh(f"{path}.err"), "w") as stderr:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "python_native.tools.kernel_report.compile_worker", str(capability)],
                    stdin=stdin, stdout=stdout, stderr=stderr, env=_worker_env(),
                ))
        for i, (proc, share) in enumerate(zip(procs, shares, strict=True)):
            path = os.path.join(folder, str(i))
            if proc.wait() != 0:
                with open(f"{path}.err") as f:
                    raise RuntimeError(f"the compile worker failed ({proc.returncode}): {f.read().strip()[-2000:]}")
            with open(f"{path}.out") as f:
                for (key, _), result in zip(share, json.load(f), strict=True):
                    _results[key] = result
    return {key: _results[key] for key in requests_by_key}
