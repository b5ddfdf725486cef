"""Nothing another user plants runs in our process, and no damaged file crashes it.

Each test plants what a hostile local user could (a shared object whose constructor leaves a
marker file, a kernel cache entry, a link) and checks that it is not used, that the process goes
on, and that the status report names it. Where a test needs a second user, files are planted by
``nobody`` (the suite switches user in a child process; it skips where it cannot).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import compiled_front_problem
from python_native.features.front import build
from python_native.foundations import faults, kernel_cache, trust
from python_native.foundations.kernel_cache import EntryKey, KernelCache

KEY = EntryKey({"dsl": "test", "specialization": {"kernel": "k", "dtype": "float16"}, "arch": "sm_90a", "source": "abc"})
OURS, EVIL = b"\x7fELF our kernel" * 50, b"\x7fELF planted kernel" * 50
PLANTED_C = '#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void planted(void) ' \
            '{ int fd = open(MARKER, O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd); }\n'


def _nobody() -> pwd.struct_passwd:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("planting files as another user needs root to switch users (this run is not root)")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine to plant files as")


def _as_nobody(script: str) -> None:
    """Run a shell script as ``nobody`` (a second local user)."""
    who = _nobody()
    proc = subprocess.run(["sh", "-c", script], user=who.pw_uid, group=who.pw_gid, extra_groups=[],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def world() -> Path:
    """A folder every user can reach (pytest's own temporary folders are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="python-native-security-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _planted_library(folder: Path, marker: Path) -> bytes:
    """A shared object whose constructor creates ``marker``: proof that it ran, were it loaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the planted shared object")
    source, out = folder / "planted.c", folder / "planted.so"
    source.write_text(PLANTED_C)
    subprocess.run([cc, "-shared", "-fPIC", f'-DMARKER="{marker}"', str(source), "-o", str(out)], check=True,
                   capture_output=True, timeout=120)
    return out.read_bytes()


def _forged_manifest(data: bytes, name: str) -> bytes:
    """The manifest an attacker who read ``trust`` would write beside a planted library."""
    return json.dumps({"format": trust.MANIFEST_FORMAT, "file": name, "size": len(data),
                       "sha256": hashlib.sha256(data).hexdigest(), "meta": {"key": build.build_key()}}).encode()


def _status(**env: str) -> dict:
    """``python -m python_native status --json`` in a fresh process (``import torch`` included)."""
    environ = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "PYTHON_NATIVE_BACKGROUND_BUILD": "0", **env}
    proc = subprocess.run([sys.executable, "-m", "python_native", "status", "--json"], capture_output=True, text=True,
                          env=environ, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout)


def _problems(data: dict, source: str) -> str:
    return " | ".join(f"{p['problem']} FIX {p['fix']}" for p in data["problems"] if p["source"] == source)


# ----- the compiled front -----


@pytest.mark.parametrize("mode", [0o775, 0o777], ids=["group-writable", "world-writable"])
def test_a_library_planted_in_a_shared_writable_cache_is_not_loaded(world, mode):
    shared, marker = world / "shared", world / "ran"
    front = shared / "front"
    front.mkdir(parents=True)
    data, name = _planted_library(world, marker), build.library_name()
    (front / name).write_bytes(data)
    trust.manifest_path(front / name).write_bytes(_forged_manifest(data, name))
    shared.chmod(mode)
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(shared), HOME=str(world / "home"))
    assert not marker.exists(), "the planted library ran"
    assert info["front"]["front"] == "python"
    problem = _problems(info, "compiled front")
    assert str(shared) in problem and "writable by" in problem and "chmod go-w" in problem, info["problems"]


def test_a_library_another_user_planted_is_not_loaded(world):
    _nobody()
    shared, marker, src = world / "shared", world / "ran", world / "src"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone may create, nobody may replace another's files
    src.mkdir()
    data, name = _planted_library(src, marker), build.library_name()
    (src / "lib.so").write_bytes(data)
    (src / "manifest").write_bytes(_forged_manifest(data, name))
    for f in src.iterdir():
        f.chmod(0o644)
    _as_nobody(f"mkdir -m 755 {shared}/front && cp {src}/lib.so {shared}/front/{name} && "
               f"cp {src}/manifest {shared}/front/{name}{trust.MANIFEST_SUFFIX}")
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(shared), HOME=str(world / "home"))
    assert not marker.exists(), "the library planted by another user ran"
    assert info["front"]["front"] == "python"
    assert "belongs to another user" in _problems(info, "compiled front"), info["problems"]


@pytest.fixture(scope="module")
def our_library() -> tuple[bytes, bytes]:
    """The front library this session built (bytes) and its manifest."""
    problem = compiled_front_problem()
    if problem is not None:
        pytest.skip(problem)
    path = build.library_path()
    return path.read_bytes(), trust.manifest_path(path).read_bytes()


def _cache_with(tmp_path: Path, library: bytes, manifest: bytes) -> Path:
    front = tmp_path / "cache" / "front"
    front.mkdir(parents=True)
    (front / build.library_name()).write_bytes(library)
    trust.manifest_path(front / build.library_name()).write_bytes(manifest)
    return tmp_path / "cache"


def test_a_library_that_does_not_match_its_manifest_is_not_loaded(tmp_path, our_library):
    library, manifest = our_library
    at = library.find(b"GCC: (")  # the compiler's note: never mapped, so the altered library still loads
    assert at > 0
    altered = library[:at] + b"gcc" + library[at + 3:]
    cache = _cache_with(tmp_path, altered, manifest)
    assert _status(PYTHON_NATIVE_CACHE_DIR=str(_cache_with(tmp_path / "intact", library, manifest)))["front"]["front"] \
        == "compiled"
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(cache))
    assert info["front"]["front"] == "python"
    assert "does not match the SHA-256 in its manifest" in _problems(info, "compiled front"), info["problems"]


def test_a_truncated_library_does_not_crash_import_torch(tmp_path, our_library):
    library, manifest = our_library
    cache = _cache_with(tmp_path, library[: len(library) // 2], manifest)
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(cache))  # a bus error before: rc -7
    assert info["front"]["front"] == "python"
    assert "truncated or replaced" in _problems(info, "compiled front"), info["problems"]


def test_disable_loads_nothing_of_ours(tmp_path):
    """A library that passes every check (ours, with its manifest) is loaded, unless the off switch is set."""
    marker = tmp_path / "ran"
    data, name = _planted_library(tmp_path, marker), build.library_name()
    front = tmp_path / "cache" / "front"
    front.mkdir(parents=True)
    (front / name).write_bytes(data)
    trust.manifest_path(front / name).write_bytes(_forged_manifest(data, name))
    _status(PYTHON_NATIVE_CACHE_DIR=str(tmp_path / "cache"))
    assert marker.exists(), "control: without the switch, a library that passes the checks is loaded"
    marker.unlink()
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(tmp_path / "cache"), PYTHON_NATIVE_DISABLE="1")
    assert not marker.exists(), "PYTHON_NATIVE_DISABLE=1 loaded the front library"
    assert info["front"]["front"] == "python" and "PYTHON_NATIVE_DISABLE" in info["front"]["why"]


def test_disable_reads_no_kernel_cache_entry(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path)
    cache.store(KEY, OURS)
    assert cache.load(KEY) == OURS
    monkeypatch.setenv("PYTHON_NATIVE_DISABLE", "1")
    assert cache.load(KEY) is None


# ----- the kernel cache -----


def _entry_bytes(payload: bytes) -> bytes:
    """An entry whose header is consistent with its payload: what anyone can compute."""
    return kernel_cache._encode(KEY, payload)


@pytest.fixture
def no_problems():
    yield
    for source in ("kernel cache", "kernel cache entry"):
        faults.resolve(source)


@pytest.mark.parametrize("how", ["world-writable folder", "copied in without a manifest", "another user's file"])
def test_the_kernel_cache_rejects_a_planted_entry(tmp_path, how, no_problems):
    cache = KernelCache(tmp_path / "kernels")
    path = cache.path(KEY)
    path.parent.mkdir()
    if how == "copied in without a manifest":
        path.write_bytes(_entry_bytes(EVIL))
    else:
        trust.write_artefact(path, _entry_bytes(EVIL))  # a manifest forged as ours would be
        if how == "world-writable folder":
            path.parent.chmod(0o777)
        else:
            os.chown(path, _nobody().pw_uid, -1)
    with pytest.warns(UserWarning, match="kernel cache"):
        assert cache.load(KEY) is None
    payload, cached = cache.get_or_build(KEY, lambda: OURS)
    assert (payload, cached) == (OURS, False)
    import python_native as pn

    problems = {p["source"]: p["problem"] for p in pn.status()["problems"]}
    named = problems.get("kernel cache", "") + problems.get("kernel cache entry", "")
    expected = {"world-writable folder": "writable by group and others", "copied in without a manifest": "has no manifest",
                "another user's file": "belongs to another user"}[how]
    assert expected in named, problems


# ----- writes follow no planted link -----


@pytest.mark.slow
def test_precompile_writes_through_no_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    shared, home = tmp_path / "shared", tmp_path / "home"
    front = shared / "front"
    front.mkdir(parents=True)
    home.mkdir()
    library = front / build.library_name()
    for planted in (library.with_suffix(".json"), trust.manifest_path(library), library.with_suffix(".lock"),
                    library.with_suffix(".build"), library.with_suffix(".log")):
        planted.symlink_to(victim)
    for folder in (shared, front, home):  # the private folder fails the checks too: nothing may be written
        folder.chmod(0o777)
    environ = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "PYTHON_NATIVE_CACHE_DIR": str(shared),
               "HOME": str(home)}
    for dsl in ("front", "cutedsl"):
        proc = subprocess.run([sys.executable, "-m", "python_native", "precompile", "--dsl", dsl, "--json"],
                              capture_output=True, text=True, env=environ, timeout=900)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert str(shared) in proc.stdout + proc.stderr and "writable by group and others" in proc.stdout + proc.stderr
    assert victim.read_text() == "precious\n"


def test_writes_replace_a_planted_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    cache = KernelCache(tmp_path / "kernels")
    cache.root.mkdir()
    for planted in (cache.path(KEY), trust.manifest_path(cache.path(KEY)), tmp_path / "note.json"):
        planted.symlink_to(victim)
    cache.store(KEY, OURS)
    trust.write_atomic(tmp_path / "note.json", b"{}")
    assert victim.read_text() == "precious\n"
    assert not cache.path(KEY).is_symlink() and cache.load(KEY) == OURS
    assert (tmp_path / "note.json").read_bytes() == b"{}"


# ----- calibration tables -----


def test_a_calibration_table_in_a_group_writable_folder_is_not_read(tmp_path, monkeypatch):
    from calibration_testing import Sources, table

    from python_native.features import calibration

    calib = Sources(tmp_path, monkeypatch)
    path = calib.user(table("cpu"))
    calib.device("cpu")
    assert calibration.describe()["in_force"] == str(path)  # control: the folder is the user's
    path.parent.chmod(0o775)
    try:
        # The tables are read again when the gates are (at the reset, where some override is gated,
        # or at the first description after it): the warning comes from whichever reads them.
        with pytest.warns(UserWarning, match="writable by group"):
            calibration.reset()
            info = calibration.describe()
        assert info["in_force"] != str(path)
        assert any("writable by group" in s["reason"] for s in info["skipped"])
        import python_native as pn

        assert any(p["source"].startswith("calibration tables") for p in pn.status()["problems"])
    finally:
        path.parent.chmod(0o755)
        for p in faults.current():
            if p["source"].startswith("calibration tables"):
                faults.resolve(p["source"])
        calib.device(None)
