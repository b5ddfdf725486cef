"""Building and loading the compiled front: one shared library per torch build, compiler and source.

The source (``front.cpp``, shipped with the package) is compiled against the running torch's
headers with the system C++ compiler, the way ``torch.utils.cpp_extension`` builds extensions but
without its ninja step, so the build needs only what Triton's own launchers already need. Each
build is stored in the user's cache under a key naming everything the binary depends on: the
source's hash, torch's version and C++ ABI, the Python version and platform, and the compiler (its
resolved path, size and modification time: identifying it costs no process). A lock per key makes
eight processes starting at once build it once.

A library runs code in the process that loads it, so it is loaded only under the rules of
``foundations.trust``: its folders and file are ours (or root's) and writable by nobody else, and
its size and SHA-256 match the manifest written beside it when it was built, checked before
``dlopen``. A build is compiled into a fresh temporary file, loaded once to prove it loads, then
published (manifest first, then a rename), so a reader sees a whole library or none. Where the
configured cache folder fails the rules, the front lives in the user's private cache
(``~/.cache/python-native/front``) instead, and the refusal is reported.

``load_cached`` never compiles (it is what ``import torch`` may call); ``build`` compiles when
nothing is cached (``python -m python_native precompile``, the background build, or
``PYTHON_NATIVE_FRONT=compiled``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from python_native.foundations import env, trust

SOURCE = Path(__file__).with_name("front.cpp")
CACHE_DIR_ENV = env.CACHE_DIR[0]
COMPILER_ENV = env.CXX[0]
MAX_LIBRARY_BYTES = 1 << 30  # no front comes near; anything bigger is not one of ours
# This interpreter's extension suffix (``.cpython-312-x86_64-linux-gnu.so``: sysconfig's EXT_SUFFIX),
# read without ``sysconfig``, whose configuration data ``import torch`` would load with a cached front.
EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


class BuildError(RuntimeError):
    """The compiler failed (the message carries its output) or is missing."""


@dataclass(frozen=True)
class Place:
    """Where the front lives: ``folder`` (links resolved) under the cache ``root`` its chain is
    checked from; ``refused`` says why the configured folder is not used, when a private one is."""

    folder: Path
    root: Path
    refused: trust.Untrusted | None = None


def _configured() -> tuple[Path, Path]:
    """``(root, folder)``: ``$PYTHON_NATIVE_CACHE_DIR/front``, else ``<cache base>/python-native/front``
    (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    override = env.cache_dir()
    if override:
        root = Path(override).expanduser()
        return root, root / "front"
    base = Path(env.user_cache_base() or os.path.join(os.path.expanduser("~"), ".cache")).expanduser()
    return base, base / "python-native" / "front"


def _private() -> tuple[Path, Path]:
    """The user's own cache, whatever the variables say: ``~/.cache/python-native/front``."""
    base = Path(os.path.expanduser("~")) / ".cache"
    return base, base / "python-native" / "front"


def cache_root() -> Path:
    """The configured folder of the front (see ``place`` for the one in use)."""
    return _configured()[1]


def place() -> Place:
    """The folder the front is loaded from and built into: the configured one when it passes the
    trust rules, else the private one (``refused`` says why); ``trust.Untrusted`` when neither does."""
    root, folder = _configured()
    try:
        return Place(trust.check_folder(folder, root), trust.resolve_root(root))
    except trust.Untrusted as refused:
        private_root, private = _private()
        if os.path.realpath(private) == os.path.realpath(folder):
            raise
        try:
            return Place(trust.check_folder(private, private_root), trust.resolve_root(private_root), refused)
        except trust.Untrusted:
            raise refused from None


def compiler() -> str | None:
    """The C++ compiler a build would use (``$CXX``, else ``c++``), resolved; None when absent."""
    found = env.compiler_program()
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
        "python": abi_tag(),
        "platform": platform_tag(),
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


def library_name(key: dict[str, str] | None = None) -> str:
    """The library's file name for ``key`` (default: this process's)."""
    digest = _digest(key or build_key())
    return f"_python_native_front_{digest}{EXT_SUFFIX}"


def abi_tag() -> str:
    """sysconfig's SOABI (``cpython-312-x86_64-linux-gnu``), the extension suffix's middle."""
    tag = EXT_SUFFIX.removeprefix(".").rpartition(".")[0]
    return tag or sys.version.split()[0]


def platform_tag() -> str:
    """sysconfig's ``get_platform()`` on Linux (``linux-x86_64``), from ``os.uname`` alone."""
    machine = os.uname().machine.replace(" ", "_").replace("/", "-")
    return f"{sys.platform}-{machine}"


def library_path(key: dict[str, str] | None = None) -> Path:
    """Where the library for ``key`` (default: this process's) lives (``trust.Untrusted`` when no
    folder passes the trust rules)."""
    return place().folder / library_name(key)


def verified(path: Path, where: Place, key: dict[str, str]) -> Path:
    """``path`` checked against the trust rules and its manifest (``FileNotFoundError`` when there is
    no library, ``trust.Untrusted`` when it fails a check): the path to load."""
    real, meta = trust.verify_file(path, where.root, MAX_LIBRARY_BYTES)
    if meta.get("key") != key:
        raise trust.Untrusted(path, "its manifest names another build", f"remove {path} (it is rebuilt where needed)")
    return real


def load_cached(where: Place | None = None) -> tuple[ModuleType | None, Path]:
    """``(module, library path)``: the cached library's module, or None when this build has none yet
    (never compiles). ``trust.Untrusted`` when the library or its folders fail a check: then nothing
    was loaded."""
    key, where = build_key(), where or place()
    path = where.folder / library_name(key)
    try:
        return _load(verified(path, where, key)), path
    except FileNotFoundError:
        return None, path


def build(force: bool = False, lock_held: bool = False) -> tuple[ModuleType, Path, bool, float]:
    """``(module, path, cached, seconds)``: the library, compiled once across processes if missing,
    damaged or untrusted (``lock_held``: the caller holds the build lock already)."""
    key, where = build_key(), place()
    path = where.folder / library_name(key)
    start = time.perf_counter()
    found = None if force else _usable(path, where, key)
    if found is not None:
        return _load(found), path, True, time.perf_counter() - start
    cxx = compiler()
    if cxx is None:
        raise BuildError(
            f"no C++ compiler found (looked for ${COMPILER_ENV} or `c++` on PATH); install g++ or clang++ "
            "to build the compiled dispatch front"
        )
    trust.make_folder(where.folder, where.root)
    with contextlib.nullcontext() if lock_held else trust.locked(lock_path(path)):
        found = None if force else _usable(path, where, key)  # another process built it while we waited
        if found is not None:
            return _load(found), path, True, time.perf_counter() - start
        module = _compile(cxx, path, key)
    return module, path, False, time.perf_counter() - start


def lock_path(path: Path) -> Path:
    """The lock a library's builders take (one build at a time per key)."""
    return path.with_suffix(".lock")


def _usable(path: Path, where: Place, key: dict[str, str]) -> Path | None:
    """The library to load when one is cached and passes every check; None otherwise (rebuild)."""
    try:
        return verified(path, where, key)
    except (FileNotFoundError, trust.Untrusted):
        return None


def _compile(cxx: str, path: Path, key: dict[str, str]) -> ModuleType:
    """Compile into a fresh file beside ``path``, load it once (a library that does not load is never
    published), then publish it with its manifest."""
    import sysconfig

    from torch.utils import cpp_extension

    name = path.name.split(".")[0]
    libs = cpp_extension.library_paths()
    tmp = trust.temp_path(path, 0o755)
    command = [
        cxx, "-O2", "-std=c++20", "-fPIC", "-shared", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={key['cxx11_abi']}", f"-DTORCH_EXTENSION_NAME={name}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *[f"-I{p}" for p in cpp_extension.include_paths()], f"-I{sysconfig.get_path('include')}",
        str(SOURCE), "-o", str(tmp),
        *[f"-L{p}" for p in libs], "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python",
        *[f"-Wl,-rpath,{p}" for p in libs],
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise BuildError(f"building the compiled dispatch front failed ({cxx}, exit {proc.returncode}):\n"
                             f"{(proc.stderr or proc.stdout)[-4000:]}")
        module = _load(tmp, name)
        trust.publish(tmp, path, {"key": key})
        return module
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _load(path: Path, name: str | None = None) -> ModuleType:
    name = name or path.name.split(".")[0]
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))  # whatever the file's suffix
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None or spec.loader is None:
        raise BuildError(f"{path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
