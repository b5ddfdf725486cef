"""What ``pip install`` puts on the path: our own names only, every package of the tree."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_under_its_installed_name():
    config = _config()
    folder_of = {name: Path(folder) for name, folder in config["package-dir"].items()}
    folder_of.setdefault("python_native", Path("python_native"))
    found = set()
    for top, folder in folder_of.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join((top, *rel.parts)))
    assert sorted(config["packages"]) == sorted(found)


def test_no_generic_top_level_name_is_installed():
    config = _config()
    tops = {name.split(".")[0] for name in config["packages"]} | set(config.get("py-modules", []))
    assert tops == {"python_native", "python_native_dsls", "_python_native_autoload"}
    assert "dsls" not in tops
