"""Make ``python_native_dsls`` importable when running from a source checkout without installing.

The backends live in the repository's ``dsls/`` folder and are installed under the name
``python_native_dsls`` (see ``[tool.setuptools]`` in pyproject.toml), so no generic top-level
name is claimed. An installed or editable package resolves that name itself; a bare checkout on
``PYTHONPATH`` does not, and this registers the folder under it. It runs when ``python_native`` is
imported, so in a bare checkout ``python_native_dsls`` can be imported only after ``python_native``
(nor does ``import torch`` import it there: torch's entry point comes with installing).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BACKENDS_PACKAGE = "python_native_dsls"


def alias_backends_folder() -> None:
    """Import ``dsls/`` as ``python_native_dsls`` when nothing else provides that name."""
    if BACKENDS_PACKAGE in sys.modules or importlib.util.find_spec(BACKENDS_PACKAGE) is not None:
        return
    folder = Path(__file__).resolve().parents[2] / "dsls"
    init = folder / "__init__.py"
    if not init.is_file():
        return
    spec = importlib.util.spec_from_file_location(BACKENDS_PACKAGE, init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[BACKENDS_PACKAGE] = module
    spec.loader.exec_module(module)
