"""Every file python-native writes goes through one writer that nobody else can redirect.

A second local user ("nobody", uid 65534) plants links and files of their own under the names we
write, in a folder they can write to (sticky and world-writable, as ``/tmp``). Each test shows the
write refused (or, in a private folder, the link replaced), the victim file untouched and the
planted entry left as it was. The suite runs as root, which can ``chown`` what it plants to
``nobody``; elsewhere these tests skip.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

import pytest

from python_native.foundations import codegen, faults, safe_write, trust

NOBODY = 65534
PRECIOUS = "precious\n"


def _root() -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("planting files as another user needs root (this run is not root)")


@pytest.fixture
def shared() -> Path:
    """A sticky folder everyone can write to, as /tmp (pytest's own folders are private)."""
    _root()
    folder = Path(tempfile.mkdtemp(prefix="python-native-shared-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


def _link(at: Path, to: Path, uid: int = NOBODY) -> Path:
    at.symlink_to(to)
    os.lchown(at, uid, uid)
    return at


def _their_file(at: Path) -> Path:
    """A world-writable file of nobody's: what we write must never land in it."""
    at.write_text(PRECIOUS)
    at.chmod(0o666)
    os.chown(at, NOBODY, NOBODY)
    return at


def _untouched(victim: Path, planted: Path) -> None:
    assert victim.read_text() == PRECIOUS
    assert planted.is_symlink() or planted.read_text() == PRECIOUS


# ----- the writer's rules, for each way it writes -----

WRITERS = {
    "write": lambda path: safe_write.write(path, b"ours"),
    "open_fresh": lambda path: os.close(safe_write.open_fresh(path)),
    "publish": lambda path: trust.write_artefact(path, b"ours"),
    "write_atomic": lambda path: trust.write_atomic(path, b"ours"),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_link_planted_in_a_shared_folder_is_refused(shared, victim, writer):
    planted = _link(shared / "out.json", victim)
    with pytest.raises(safe_write.Untrusted, match="symbolic link in a folder other users can write"):
        WRITERS[writer](planted)
    _untouched(victim, planted)


@pytest.mark.parametrize("writer", WRITERS)
def test_another_users_file_is_never_written_into(shared, writer):
    planted = _their_file(shared / "out.json")
    with pytest.raises(safe_write.Untrusted, match="belongs to another user"):
        WRITERS[writer](planted)
    assert planted.read_text() == PRECIOUS and planted.stat().st_uid == NOBODY


def test_another_users_file_in_a_private_folder_is_refused_too(tmp_path):
    _root()
    planted = _their_file(tmp_path / "out.json")
    with pytest.raises(safe_write.Untrusted, match="belongs to another user"):
        safe_write.write(planted, "ours")
    assert planted.read_text() == PRECIOUS


def test_a_link_of_ours_in_a_private_folder_is_replaced_not_followed(tmp_path, victim):
    _link(tmp_path / "out.json", victim, uid=os.geteuid())
    safe_write.write(tmp_path / "out.json", "ours")
    assert victim.read_text() == PRECIOUS
    assert not (tmp_path / "out.json").is_symlink() and (tmp_path / "out.json").read_text() == "ours"


@pytest.mark.parametrize("mode", [0o777, 0o775], ids=["world-writable", "group-writable"])
def test_a_shared_folder_that_is_not_sticky_is_refused(tmp_path, mode):
    _root()
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(safe_write.Untrusted, match="is writable by"):
        safe_write.write(folder / "new.json", "ours")
    assert list(folder.iterdir()) == []


def test_a_sticky_shared_folder_takes_new_files_and_our_own(shared):
    path = safe_write.write(shared / "new.json", "one")
    info = os.lstat(path)
    assert path.read_text() == "one" and info.st_uid == os.geteuid()
    assert not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    safe_write.write(shared / "new.json", "two")  # ours: replaced
    assert path.read_text() == "two"
    assert sorted(p.name for p in shared.iterdir()) == ["new.json"]  # no temporary file left behind


def test_a_folder_reached_through_another_users_link_is_refused(shared, victim):
    planted = _link(shared / "dumps", victim.parent)
    with pytest.raises(safe_write.Untrusted, match="link that belongs to another user"):
        safe_write.write(planted / "victim.txt", "ours")
    assert victim.read_text() == PRECIOUS


def test_a_folder_another_user_made_in_a_shared_folder_is_refused(shared):
    theirs = shared / "dumps"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(safe_write.Untrusted, match="belongs to another user"):
        safe_write.write(theirs / "out.json", "ours")
    assert list(theirs.iterdir()) == []


# ----- each writer of the package -----


@pytest.fixture
def dump_faults(monkeypatch):
    monkeypatch.setattr(codegen, "_refused_dump_dirs", set())
    yield
    faults.resolve("PYTHON_NATIVE_DUMP_DIR")


def test_router_dumps_follow_no_planted_link_and_stop_with_one_warning(shared, victim, monkeypatch, dump_faults):
    monkeypatch.setenv("PYTHON_NATIVE_DUMP_DIR", str(shared))
    planted = _link(shared / "aten_add_Tensor__none.py", victim)
    theirs = _their_file(shared / "aten_mul_Tensor__none.py")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        codegen.dump("# router\n", planted.name)
        codegen.dump("# router\n", theirs.name)
        codegen.dump("# router\n", "aten_sub_Tensor__none.py")
    _untouched(victim, planted)
    assert theirs.read_text() == PRECIOUS
    dumped = [str(w.message) for w in caught if "DUMP_DIR" in str(w.message)]
    assert len(dumped) == 1 and str(planted) in dumped[0] and "remove the link" in dumped[0], dumped
    assert str(planted) in faults.problem_of("PYTHON_NATIVE_DUMP_DIR")
    assert not (shared / "aten_sub_Tensor__none.py").exists()  # the refused folder is skipped from then on


def test_router_dumps_into_a_world_writable_folder_are_refused(tmp_path, monkeypatch, dump_faults):
    _root()
    folder = tmp_path / "dumps"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv("PYTHON_NATIVE_DUMP_DIR", str(folder))
    with pytest.warns(UserWarning, match="writable by group and others"):
        codegen.dump("# router\n", "aten_add_Tensor__none.py")
    assert list(folder.iterdir()) == []


def test_bench_save_json_is_refused_before_the_run_and_at_each_write(shared, victim):
    from python_native.tools.commands import bench
    from python_native.tools.commands.usage import UsageError, writable_file

    planted = _link(shared / "rows.json", victim)
    with pytest.raises(UsageError, match="--save-json .*symbolic link"):
        writable_file("--save-json", str(planted))
    with pytest.raises(safe_write.Untrusted):
        bench._write_json(str(planted), {"device": "cpu"}, [])
    _untouched(victim, planted)


def test_bench_plot_is_refused(shared, victim):
    pytest.importorskip("matplotlib")
    from python_native.tools.bench import output
    from python_native.tools.bench.rows import Row

    row = Row("softmax", "fwd", [4, 8], "float32", True, 1.0, 2.0, 2.0, 128, None)
    planted = _link(shared / "plot.png", victim)
    with pytest.raises(safe_write.Untrusted):
        output.plot([row], str(planted))
    _untouched(victim, planted)
    output.plot([row], str(shared / "fresh.png"))
    assert (shared / "fresh.png").read_bytes().startswith(b"\x89PNG")


def test_calibration_tables_written_to_a_named_file_are_refused(shared, victim, tmp_path):
    from calibration_testing import table

    from python_native.features.calibration import store

    planted = _link(shared / "table.json", victim)
    with pytest.raises(safe_write.Untrusted):
        store.save(table("cpu"), planted)
    _untouched(victim, planted)
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    assert "writable by group and others" in store.unwritable(open_folder)
    with pytest.raises(safe_write.Untrusted):
        store.save(table("cpu"), open_folder / "table.json")
    assert list(open_folder.iterdir()) == []


def test_the_replay_proof_is_refused(shared, victim, monkeypatch):
    from python_native.features.front import proof

    monkeypatch.setattr(proof, "folder", lambda: shared)
    monkeypatch.setattr(proof, "versions", lambda: {"torch": "1", "triton": "2"})
    planted = _link(shared / proof.filename("GPU X", proof.versions()), victim)
    with pytest.raises(safe_write.Untrusted):
        proof.write("GPU X", [{"case": "c"}], True)
    _untouched(victim, planted)


def test_the_background_builders_log_is_refused(shared, victim, monkeypatch):
    from python_native.features.front import background

    library = shared / "front.so"
    planted = _link(background.log_path(library), victim)

    def no_spawn(*args, **kwargs):
        raise AssertionError("the builder must not start when its log is refused")

    monkeypatch.setattr(background.os, "posix_spawn", no_spawn)
    lock = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(safe_write.Untrusted):
            background._spawn(lock, library, None)
    finally:
        os.close(lock)
    _untouched(victim, planted)


def test_a_lock_file_another_user_planted_is_refused(shared):
    planted = _their_file(shared / "build.lock")
    with pytest.raises(safe_write.Untrusted, match="not a lock file of ours"):
        trust.open_lock(planted)


def test_temporary_files_are_ours_alone():
    path = safe_write.new_temp_file("traceback", prefix="python-native-test-", suffix=".txt")
    try:
        info = os.lstat(path)
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid() and path.read_text() == "traceback"
    finally:
        path.unlink()
