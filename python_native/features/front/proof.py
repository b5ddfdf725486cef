"""Proofs of replay: a GPU run that compared replayed calls with Python-served ones, per GPU model
and torch and Triton versions, kept in the user's cache like a calibration table.

Replay launches the compiled kernels itself, the way Triton's generated launcher would; that
mirror is checked by a run on the GPU (``python -m python_native bench --prove-replay``), which
writes ``<user cache>/python-native/replay/<gpu>-torch<version>-triton<version>.json``. Without
``PYTHON_NATIVE_REPLAY`` set, replay is on only where such a proof names every GPU of the machine
and the running versions exactly. A proof is read like every user file: a regular file of ours
(owned by this user, not writable by others), small, valid JSON of the expected shape; anything
else is named in the status report and changes nothing.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from python_native.foundations import env, nvml, safe_write

MAX_BYTES = 1 << 16
PROVE = "python -m python_native bench --prove-replay"


def folder() -> Path:
    """``<user cache dir>/python-native/replay`` (platformdirs' user cache dir, as calibration's)."""
    try:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("python-native", appauthor=False))
    except ImportError:
        base = Path(env.user_cache_base() or os.path.join(os.path.expanduser("~"), ".cache")) / "python-native"
    return base / "replay"


def versions() -> dict[str, str]:
    """The running torch and Triton versions (exact: a proof speaks for these builds only)."""
    import torch

    from python_native.foundations import dsl_registry

    triton = dsl_registry.version("triton") if dsl_registry.is_known("triton") else None
    return {"torch": str(torch.__version__), "triton": str(triton) if triton is not None else "none"}


def filename(device_key: str, found: dict[str, str]) -> str:
    slug = "_".join(p for p in "".join(c if c.isalnum() else "_" for c in device_key.lower()).split("_") if p)
    tags = "".join(f"-{name}{version.replace('+', '_')}" for name, version in sorted(found.items()))
    return f"{slug}{tags}.json"


def _read_ours(path: Path) -> tuple[Any, str]:
    """``(parsed JSON, "")`` for a small regular file this user owns and no one else may write, else ``(None, why)``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None, "absent"
    except OSError as e:
        return None, f"cannot be opened ({e.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return None, "not a small regular file"
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return None, "not owned by this user, or writable by others"
        with os.fdopen(fd, "rb", closefd=False) as f:
            return json.loads(f.read(MAX_BYTES + 1)), ""
    except (OSError, ValueError, RecursionError) as e:
        return None, f"unreadable ({type(e).__name__})"
    finally:
        os.close(fd)


def check(data: Any, device_key: str, found: dict[str, str]) -> str:
    """Why ``data`` is not a passing proof for ``device_key`` and ``found`` versions ('' when it is)."""
    if not isinstance(data, dict):
        return "not a proof (a JSON object is expected)"
    if data.get("device") != device_key:
        return f"names device {data.get('device')!r}"
    for name, version in found.items():
        if data.get(name) != version:
            return f"was made with {name} {data.get(name)!r} (running {version})"
    ops = data.get("ops")
    if data.get("result") != "pass" or not isinstance(ops, list) or not ops:
        return "does not record a passing run over at least one op"
    return ""


def find() -> tuple[bool, str]:
    """``(proven, why)``: whether a passing proof names every GPU here and the running versions."""
    keys = nvml.device_keys()
    if not keys:
        return False, "no GPU here (replay launches on CUDA devices only)"
    found = versions()
    paths = []
    for key in sorted(keys):
        path = folder() / filename(key, found)
        data, problem = _read_ours(path)
        problem = problem or check(data, key, found)
        if problem:
            return False, f"not proven on {key} with torch {found['torch']} and triton {found['triton']}: " \
                          f"{path} {problem} (run `{PROVE}` on this machine)"
        paths.append(str(path))
    return True, f"proven on this GPU and versions ({', '.join(paths)})"


def write(device_key: str, ops: list[dict[str, Any]], passed: bool) -> Path:
    """Write the proof of a run over ``ops`` on ``device_key`` (atomically; readable by this user alone)."""
    found = versions()
    path = folder() / filename(device_key, found)
    document = {"device": device_key, **found, "result": "pass" if passed else "fail", "ops": ops,
                "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    safe_write.write(path, json.dumps(document, indent=1, sort_keys=True), mode=0o600)
    return path
