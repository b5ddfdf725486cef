"""The glossary of docs/architecture.md ("Words") holds each word to one meaning: the words it
retires must not come back in the package's sources (``python_native/``, ``dsls/``), in a file's
text or in its path. The retired words are read from the page, so retiring one more is one edit
there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("python_native", "dsls")
SUFFIXES = {".py", ".pyi", ".md", ".toml", ".cpp", ".h", ".txt", ".cfg"}
# derive_forms= kept its old name as a deprecated alias: the registry and the public API take it.
ALLOWED = {"derive_variants": {"python_native/__init__.py", "python_native/core/registry.py",
                               "python_native/core/arguments.py"}}
# What the glossary must retire at least (each was renamed to torch's word or to one meaning).
REQUIRED = {"declared_ops", "DeclaredOp", "derive_variants", "core/below", "core.reasons", "fresh.py",
            "python_native_dsls.reasons"}


def retired_words(page: str) -> list[str]:
    """The backticked words of the glossary's "Retired words" paragraph (asides in brackets left out)."""
    words_section = page.split("\n## Words\n", 1)[1].split("\n## ", 1)[0]
    paragraph = words_section.split("Retired words", 1)[1].split("\n\n", 1)[0]
    listed = paragraph.split("`dsls/`:", 1)[1]
    return re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", listed))


def returns(root: Path, words: list[str]) -> list[tuple[str, str]]:
    """``(path, word)`` for each retired word found in a source file's path or text under ``root``."""
    found = []
    for top in SOURCES:
        for path in sorted((root / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix not in SUFFIXES:
                continue
            rel = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [(rel, w) for w in words if (w in f"/{rel}" or w in text) and rel not in ALLOWED.get(w, ())]
    return found


def test_the_glossary_retires_the_renamed_words():
    words = retired_words((ROOT / "docs" / "architecture.md").read_text())
    assert REQUIRED <= set(words), REQUIRED - set(words)


def test_no_retired_word_comes_back_in_the_sources():
    words = retired_words((ROOT / "docs" / "architecture.md").read_text())
    assert returns(ROOT, words) == []


def test_a_retired_word_that_comes_back_is_found(tmp_path: Path):
    words = retired_words((ROOT / "docs" / "architecture.md").read_text())
    (tmp_path / "python_native" / "core").mkdir(parents=True)
    (tmp_path / "dsls").mkdir()
    (tmp_path / "python_native" / "snapshot.py").write_text('KEYS = ("declared_ops",)\n')
    (tmp_path / "python_native" / "core" / "registry.py").write_text("derive_variants = None  # the alias\n")
    (tmp_path / "python_native" / "core" / "slots.py").write_text("from python_native.core.reasons import x\n")
    (tmp_path / "dsls" / "reasons.py").write_text("")
    assert sorted(returns(tmp_path, words)) == [
        ("dsls/reasons.py", "/dsls/reasons"),
        ("python_native/core/slots.py", "core.reasons"),
        ("python_native/snapshot.py", "declared_ops"),
    ]
    (tmp_path / "python_native" / "snapshot.py").write_text("derive_variants = True\n")
    assert ("python_native/snapshot.py", "derive_variants") in returns(tmp_path, words)
