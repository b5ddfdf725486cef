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

from python_native.kernel_cache import CACHE_DIR_ENV, MAGIC, EntryKey, KernelCache, default_root, source_fingerprint

KEY = EntryKey({"dsl": "test", "variant": {"kernel": "k", "dtype": "float16"}, "arch": "sm_90a", "source": "abc"})
OTHER = EntryKey({"dsl": "test", "variant": {"kernel": "k", "dtype": "bfloat16"}, "arch": "sm_90a", "source": "abc"})
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
        from python_native.kernel_cache import EntryKey, KernelCache
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
        from python_native.kernel_cache import EntryKey, KernelCache
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
