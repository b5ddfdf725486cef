"""Building and loading the compiled front: one shared library per torch build, compiler and source.

The source (``front.cpp``, shipped with the package) is compiled against the running torch's
headers with the system C++ compiler, the way ``torch.utils.cpp_extension`` builds extensions but
without its ninja step, so the build needs only what Triton's own launchers already need. Each
build is stored in the user's cache under a key naming everything the binary depends on: the
source's hash, torch's version and C++ ABI, the Python version and platform, and the compiler (its
resolved path, size and modification time: identifying it costs no process). A lock per key makes
eight processes starting at once build it once; the library is written to a temporary file and
renamed, so a reader sees a whole library or none.

``load_cached`` never compiles (it is what ``import torch`` may call); ``build`` compiles when
nothing is cached (``python -m python_native precompile``, or ``PYTHON_NATIVE_FRONT=compiled``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from python_native.foundations import env

try:
    import fcntl
except ImportError:  # pragma: no cover  (non-POSIX: no cross-process lock, writes stay atomic)
    fcntl = None  # type: ignore[assignment]

SOURCE = Path(__file__).with_name("front.cpp")
CACHE_DIR_ENV = env.CACHE_DIR[0]
COMPILER_ENV = env.CXX[0]


class BuildError(RuntimeError):
    """The compiler failed (the message carries its output) or is missing."""


def cache_root() -> Path:
    """``$PYTHON_NATIVE_CACHE_DIR/front``, else ``$XDG_CACHE_HOME/python-native/front`` (``~/.cache``)."""
    override = env.cache_dir()
    if override:
        return Path(override).expanduser() / "front"
    base = env.user_cache_base() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "python-native" / "front"


def compiler() -> str | None:
    """The C++ compiler a build would use (``$CXX``, else ``c++``), resolved; None when absent."""
    name = env.cxx() or "c++"
    found = shutil.which(name)
    return os.path.realpath(found) if found else None


def build_key() -> dict[str, str]:
    """Everything the library depends on, as recorded beside it (cheap: no process is started)."""
    import torch

    cxx = compiler()
    stat = os.stat(cxx) if cxx else None
    return {
        "source": source_digest(),
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", "")),
        "cxx11_abi": str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "python": sysconfig.get_config_var("SOABI") or sys.version.split()[0],
        "platform": sysconfig.get_platform(),
        "compiler": f"{cxx}:{stat.st_size}:{int(stat.st_mtime)}" if stat else "none",
    }


def source_digest() -> str:
    """The hash of ``front.cpp`` and the headers beside it that it includes (``replay_*.h``)."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    for header in sorted(SOURCE.parent.glob("*.h")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return digest.hexdigest()


def _digest(key: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def library_path(key: dict[str, str] | None = None) -> Path:
    """Where the library for ``key`` (default: this process's) lives in the cache."""
    digest = _digest(key or build_key())
    return cache_root() / f"_python_native_front_{digest}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def load_cached() -> tuple[ModuleType | None, Path]:
    """The cached library's module, or None when this build has none yet (never compiles)."""
    path = library_path()
    if not path.is_file():
        return None, path
    return _load(path), path


def build(force: bool = False) -> tuple[ModuleType, Path, bool, float]:
    """``(module, path, cached, seconds)``: the library, compiled once across processes if missing."""
    key = build_key()
    path = library_path(key)
    start = time.perf_counter()
    if path.is_file() and not force:
        return _load(path), path, True, time.perf_counter() - start
    cxx = compiler()
    if cxx is None:
        raise BuildError(
            f"no C++ compiler found (looked for ${COMPILER_ENV} or `c++` on PATH); install g++ or clang++ "
            "to build the compiled dispatch front"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_suffix(".lock")):
        if path.is_file() and not force:  # another process built it while we waited
            return _load(path), path, True, time.perf_counter() - start
        _compile(cxx, path, key)
    return _load(path), path, False, time.perf_counter() - start


def _compile(cxx: str, path: Path, key: dict[str, str]) -> None:
    from torch.utils import cpp_extension

    name = path.name.split(".")[0]
    libs = cpp_extension.library_paths()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".so")
    os.close(fd)
    command = [
        cxx, "-O2", "-std=c++20", "-fPIC", "-shared", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={key['cxx11_abi']}", f"-DTORCH_EXTENSION_NAME={name}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *[f"-I{p}" for p in cpp_extension.include_paths()], f"-I{sysconfig.get_path('include')}",
        str(SOURCE), "-o", tmp,
        *[f"-L{p}" for p in libs], "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python",
        *[f"-Wl,-rpath,{p}" for p in libs],
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise BuildError(f"building the compiled dispatch front failed ({cxx}, exit {proc.returncode}):\n"
                             f"{(proc.stderr or proc.stdout)[-4000:]}")
        os.replace(tmp, path)
        path.with_suffix(".json").write_text(json.dumps(key, indent=2, sort_keys=True))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _load(path: Path) -> ModuleType:
    name = path.name.split(".")[0]
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"{path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
