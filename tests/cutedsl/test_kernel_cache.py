"""The on-disk kernel cache: round trips, rejection of bad entries, and one build across processes.

Pure Python (no cutlass): these run everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from python_native.foundations.kernel_cache import (
    CACHE_DIR_ENV,
    MAGIC,
    EntryKey,
    KernelCache,
    default_root,
    source_fingerprint,
)

KEY = EntryKey({"dsl": "test", "specialization": {"kernel": "k", "dtype": "float16"}, "arch": "sm_90a", "source": "abc"})
OTHER = EntryKey({"dsl": "test", "specialization": {"kernel": "k", "dtype": "bfloat16"}, "arch": "sm_90a", "source": "abc"})
PAYLOAD = b"\x7fELF compiled kernel bytes" * 100


def test_store_then_load_round_trips(tmp_path):
    cache = KernelCache(tmp_path)
    assert cache.load(KEY) is None
    path = cache.store(KEY, PAYLOAD)
    assert path.read_bytes().startswith(MAGIC)
    assert cache.load(KEY) == PAYLOAD
    assert cache.load(OTHER) is None


def test_entry_reloads_in_a_fresh_process(tmp_path):
    KernelCache(tmp_path).store(KEY, PAYLOAD)
    code = textwrap.dedent(f"""
        from python_native.foundations.kernel_cache import EntryKey, KernelCache
        key = EntryKey({dict(KEY.fields)!r})
        payload = KernelCache({str(tmp_path)!r}).load(key)
        print(len(payload), payload == {PAYLOAD!r})
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(len(PAYLOAD)), "True"]


def _corrupt(path, how: str) -> None:
    data = path.read_bytes()
    if how == "tampered":
        data = data[:-5] + bytes(b ^ 0xFF for b in data[-5:])
    elif how == "truncated":
        data = data[: len(data) - 100]
    elif how == "no-magic":
        data = b"junk" + data[len(MAGIC) :]
    elif how == "bad-header":
        data = MAGIC + b"{not json\n" + PAYLOAD
    path.write_bytes(data)


@pytest.mark.parametrize("how", ["tampered", "truncated", "no-magic", "bad-header"])
def test_bad_entry_is_ignored_removed_and_rebuilt(tmp_path, how):
    cache = KernelCache(tmp_path)
    path = cache.store(KEY, PAYLOAD)
    _corrupt(path, how)
    assert cache.load(KEY) is None
    assert not path.exists()
    builds = []
    payload, cached = cache.get_or_build(KEY, lambda: builds.append(1) or PAYLOAD)
    assert (payload, cached, builds) == (PAYLOAD, False, [1])
    assert cache.get_or_build(KEY, lambda: pytest.fail("rebuilt a valid entry")) == (PAYLOAD, True)


def test_foreign_entry_is_not_loaded(tmp_path):
    """A valid entry for another key, placed at this key's path, must not be taken for it."""
    cache = KernelCache(tmp_path)
    other_path = cache.store(OTHER, b"another kernel")
    os.replace(other_path, cache.path(KEY))
    assert cache.load(KEY) is None
    header = json.loads(cache.store(KEY, PAYLOAD).read_bytes()[len(MAGIC) :].split(b"\n", 1)[0])
    assert header["key"] == json.loads(KEY.canonical()) and header["size"] == len(PAYLOAD)


def test_concurrent_processes_build_once(tmp_path):
    """Two processes asking for a missing entry at once: one builds, the other reuses it."""
    log = tmp_path / "builds.log"
    code = textwrap.dedent(f"""
        import time
        from python_native.foundations.kernel_cache import EntryKey, KernelCache
        def build():
            with open({str(log)!r}, "a") as f:
                f.write("built\\n")
            time.sleep(1.0)
            return b"payload"
        payload, cached = KernelCache({str(tmp_path / "cache")!r}).get_or_build(EntryKey({{"k": 1}}), build)
        print(payload.decode(), cached)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = sorted(p.communicate(timeout=120)[0].split()[1] for p in procs)
    assert log.read_text().count("built") == 1
    assert outs == ["False", "True"]
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp-")]


def test_default_root_honours_the_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "here"))
    assert default_root() == tmp_path / "here"
    assert KernelCache().root == tmp_path / "here"
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "python-native" / "kernels"


def test_key_fields_change_the_entry(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("x = 1\n")
    before = source_fingerprint(a)
    a.write_text("x = 2\n")
    assert source_fingerprint(a) != before
    assert KEY.file_name() != OTHER.file_name()
    assert KEY.file_name() == EntryKey(dict(reversed(list(KEY.fields.items())))).file_name()


# ----- hostile entries and unusable folders -----


def _load_within(cache: KernelCache, key: EntryKey, seconds: float = 20.0):
    """``cache.load(key)`` in a thread: a load that blocks (on a FIFO, say) fails the test instead of hanging it."""
    import threading

    result: list = []
    worker = threading.Thread(target=lambda: result.append(cache.load(key)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "load blocked"
    return result[0]


@pytest.mark.parametrize("what", ["folder", "fifo", "device-link", "deep-json", "huge-header"])
def test_hostile_entry_is_never_read_and_the_kernel_still_builds(tmp_path, what):
    cache = KernelCache(tmp_path)
    path = cache.path(KEY)
    if what == "folder":
        path.mkdir()
    elif what == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs os.mkfifo")
        os.mkfifo(path)
    elif what == "device-link":
        os.symlink("/dev/zero", path)  # an endless read, were it read
    elif what == "deep-json":
        path.write_bytes(MAGIC + b"[" * 50_000 + b"\n" + PAYLOAD)
    else:
        path.write_bytes(MAGIC + b" " * (2 << 16) + b"\n" + PAYLOAD)
    assert _load_within(cache, KEY) is None
    assert os.path.exists("/dev/zero")
    if what == "folder":  # a folder stays where it is: the kernel is built, not stored, and that is said
        from python_native.foundations import faults

        with pytest.warns(UserWarning, match="kernel cache: the entry .* cannot be written"):
            assert cache.get_or_build(KEY, lambda: PAYLOAD) == (PAYLOAD, False)
        faults.resolve("kernel cache")
        return
    assert cache.get_or_build(KEY, lambda: PAYLOAD) == (PAYLOAD, False)
    assert cache.load(KEY) == PAYLOAD


@pytest.mark.parametrize("how", ["root-is-a-file", "lock-is-a-folder"])
def test_unusable_cache_folder_costs_the_cache_only(tmp_path, how):
    from python_native.foundations import faults

    if how == "root-is-a-file":
        (tmp_path / "root").write_text("")
        cache = KernelCache(tmp_path / "root" / "kernels")
    else:
        cache = KernelCache(tmp_path)
        (tmp_path / (KEY.file_name() + ".lock")).mkdir()
    try:
        with pytest.warns(UserWarning, match="kernel cache: the folder .* cannot be used"):
            assert cache.get_or_build(KEY, lambda: PAYLOAD) == (PAYLOAD, False)
        assert "compiled without caching" in " ".join(p["fix"] for p in faults.current())
        import python_native as pn

        assert "kernel cache" in {p["source"] for p in pn.status()["problems"]}
        with pytest.raises(ValueError, match="a real build error"):  # a build's own error is never swallowed
            cache.get_or_build(OTHER, lambda: (_ for _ in ()).throw(ValueError("a real build error")))
    finally:
        faults.resolve("kernel cache")
