"""The patch rules hold across the stated transformers range: its oldest release and the installed one.

The oldest release is installed into the test's temporary folder (with the huggingface_hub and
tokenizers it requires, pinned, and ``--no-deps``: pip never touches torch), and
``transformers_range_script.py`` runs in a subprocess with that folder first on the path. For tiny
Llama, Qwen3 and Mistral it checks that the norms, gated MLP, rotary function and loss are
routed, that one training step through the declared ops gives the unpatched loss and gradients,
and that unpatching is exact. DeepSeek-V3's interleaved rotary function had another formula in the
oldest release; the rules must leave it alone, saying why.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

OLDEST = "4.56.0"  # the floor of the test extra's transformers in pyproject.toml
# What transformers 4.56.0 requires that the current environment's versions would break.
OLDEST_DEPS = ("huggingface_hub==0.35.3", "tokenizers==0.22.1")
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "transformers_range_script.py"
FAMILIES = ["llama", "qwen3", "mistral"]


def _install_oldest(folder: Path) -> None:
    """``transformers==OLDEST`` into ``folder``; skipped, naming pip's last line, where pip cannot get it."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--target", str(folder), f"transformers=={OLDEST}",
           *OLDEST_DEPS]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        reason = f"pip could not install transformers=={OLDEST}: {(lines or ['no output'])[-1]}"
        if os.environ.get("CI"):  # CI has the registry: a failed install there is a failure
            pytest.fail(reason)
        pytest.skip(reason)


def _run(families: list[str], tmp: Path, path_first: Path | None) -> dict:
    """The script's JSON line; ``path_first`` (a transformers release) ahead of the checkout on the path."""
    path = [str(p) for p in (path_first, ROOT) if p is not None] + list(filter(None, [os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "HF_HOME": str(tmp / "hf"), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run([sys.executable, str(SCRIPT), *families], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_tested_oldest_release_is_the_stated_floor() -> None:
    """The test extra's transformers floor is the release this file installs, so the two cannot drift."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    (floor,) = [Requirement(r) for r in extra if Requirement(r).name == "transformers"]
    assert [(s.operator, Version(s.version)) for s in floor.specifier] == [(">=", Version(OLDEST))]


@pytest.mark.slow
@pytest.mark.parametrize("release", ["installed", "oldest"])
def test_rules_take_the_families_at_both_ends(release: str, tmp_path: Path) -> None:
    folder = None
    if release == "oldest":
        folder = tmp_path / "site"
        _install_oldest(folder)
    families = FAMILIES + (["deepseek_v3"] if release == "oldest" else [])
    result = _run(families, tmp_path, folder)
    if release == "oldest":
        assert result["transformers"] == OLDEST
        assert Path(result["transformers_file"]).is_relative_to(folder)
    else:
        assert result["transformers"] == importlib.metadata.version("transformers")
    for family in FAMILIES:
        assert result["families"][family]["failed"] == [], (family, result["families"][family])
    if release == "oldest":
        _assert_interleaved_rotary_left_alone(result["families"]["deepseek_v3"])


def _assert_interleaved_rotary_left_alone(deepseek: dict) -> None:
    """4.56's ``apply_rotary_pos_emb_interleave`` de-interleaves q and k, then rotates them with the
    full-width tables: a layout the rotary op does not have. It stays the function's own code, the
    report says why, and the rest of the model is patched and trains as unpatched."""
    rows = {(rule, target): (status, why) for rule, target, status, why in deepseek["rows"]}
    status, why = rows["rotary", "transformers.models.deepseek_v3.modeling_deepseek_v3.apply_rotary_pos_emb_interleave"]
    assert status == "left alone"
    assert why.startswith("rotates q and k in a layout none of rotary's reproduces bit for bit"), why
    # The model calls only the interleaved function: the rotary ops never serve, everything else holds.
    assert deepseek["failed"] == ["op rotary was not served by an override",
                                  "op rotary_backward was not served by an override"]
