"""What a fresh process sees: autoload on ``import torch``, environment switches, the main job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


def installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == "python_native" for ep in entry_points(group="torch.backends"))


@pytest.mark.skipif(not installed(), reason="the package's entry point is not installed (pip install -e .)")
def test_import_torch_mounts_controller_without_dsl_runtimes():
    r = run(
        "import sys, torch\n"
        "pn = torch.backends.python_native\n"
        "import python_native\n"
        "assert pn is python_native, type(pn)\n"
        "assert 'triton' in pn.all_dsls and 'cutedsl' in pn.all_dsls\n"
        "assert not any(m == 'triton' or m.startswith(('triton.', 'cutlass')) for m in sys.modules), "
        "[m for m in sys.modules if 'triton' in m]\n"
        "print('ok')"
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_autoload_can_be_turned_off():
    r = run("import torch, sys; print('python_native' in sys.modules)", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0 and r.stdout.strip() == "False"


def test_broken_package_never_breaks_import_torch(tmp_path):
    broken = tmp_path / "python_native"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); sys.modules.pop('python_native', None)\n"
        "import _python_native_autoload as a; a.mount(); import torch; print('alive')"
    )
    environ = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=environ)
    assert r.returncode == 0 and "alive" in r.stdout
    assert "broken on purpose" in r.stderr  # logged, not raised


@pytest.mark.parametrize("var", ["PYTHON_NATIVE_DISABLE", "TORCH_DISABLE_NATIVE_JIT"])
def test_global_off_switch(var):
    r = run(
        "import torch, types, python_native as pn\n"
        "pn.register_dsl('d', types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: None))\n"
        "h = pn.register_op_override('d', 'aten', 'sub.Tensor', 'CPU', None, lambda s, o, alpha: s, unconditional_override=True)\n"
        "x = torch.ones(2)\n"
        "assert not h.active and torch.equal(torch.sub(x, x), torch.zeros(2))\n"
        "print('ok')",
        **{var: "1"},
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("var", ["PYTHON_NATIVE_SKIP_VERSION_CHECK", "TORCH_NATIVE_SKIP_VERSION_CHECK"])
def test_skip_version_check(var):
    code = (
        "from packaging.version import Version\n"
        "from python_native.panel import dsl_support\n"
        "print(dsl_support.version_problem('x', Version('1.0'), Version('9.0')))"
    )
    assert "outside the supported range" in run(code).stdout
    assert run(code, **{var: "1"}).stdout.strip() == "None"


@pytest.mark.parametrize("var", ["PYTHON_NATIVE_ORDER_FN", "TORCH_PYTHON_NATIVE_USER_GRAPH_ORDER_FN"])
def test_order_function_from_environment(var, tmp_path):
    (tmp_path / "myorder.py").write_text(
        "def last_first(op_symbol, dispatch_key, nodes):\n"
        "    assert (op_symbol, dispatch_key) == ('sub.Tensor', 'CPU'), (op_symbol, dispatch_key)\n"
        "    return [n for n in reversed(nodes) if n.dsl_name]\n"
    )
    r = run(
        "import torch, types, python_native as pn\n"
        "pn.register_dsl('d', types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: None))\n"
        "pn.register_op_override('d', 'aten', 'sub.Tensor', 'CPU', lambda *a, **k: True, lambda s, o, alpha: s + 1)\n"
        "pn.register_op_override('d', 'aten', 'sub.Tensor', 'CPU', lambda *a, **k: True, lambda s, o, alpha: s + 2)\n"
        "print(torch.sub(torch.zeros(1), torch.zeros(1)).item())",
        PYTHONPATH=f"{ROOT}:{tmp_path}",
        **{var: "myorder.last_first"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2.0"


def test_third_party_dsl_from_entry_point(tmp_path):
    dist = tmp_path / "extdsl-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extdsl\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[python_native.dsls]\nextdsl = extdsl_mod\n")
    (tmp_path / "extdsl_mod.py").write_text(
        "def runtime_available():\n    return True\n\ndef runtime_version():\n    return None\n"
    )
    r = run("import python_native as pn; print(pn.all_dsls, pn.extdsl.available)", PYTHONPATH=f"{ROOT}:{tmp_path}")
    assert r.returncode == 0, r.stderr
    assert "'extdsl'" in r.stdout and "True" in r.stdout


def test_dump_dir_gets_every_generated_router(tmp_path):
    r = run(
        "import torch, types, python_native as pn\n"
        "pn.register_dsl('d', types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: None))\n"
        "pn.register_op_override('d', 'aten', 'sub.Tensor', 'CPU', lambda *a, **k: True, lambda s, o, alpha: s)\n",
        PYTHON_NATIVE_DUMP_DIR=str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    dumped = sorted(p.name for p in tmp_path.iterdir())
    assert any("sub_Tensor__CPU" in name for name in dumped), dumped
    assert all(compile((tmp_path / n).read_text(), n, "exec") for n in dumped)


def test_main_job_report_and_json():
    r = subprocess.run([sys.executable, "-m", "python_native"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "torch " in r.stdout and "triton" in r.stdout and "cutedsl" in r.stdout and "Overrides" in r.stdout
    r = subprocess.run([sys.executable, "-m", "python_native", "--json"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    data = json.loads(r.stdout)
    assert {d["name"] for d in data["dsls"]} >= {"triton", "cutedsl"}
    assert all({"op", "dispatch_key", "dsl", "active"} <= set(o) for o in data["overrides"])
