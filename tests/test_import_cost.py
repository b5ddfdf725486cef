"""What ``import torch`` loads of python-native: the modules that install the overrides, nothing more.

Everything else (the custom ops of ``python_native.ops``, model patching, checked mode's contracts,
calibration's measuring and summary, the status snapshot, ...) loads on first use. A module that
joins the set below makes every ``import torch`` pay for it: load it where it is first needed, or
add it here with the reason. ``benchmarks/import_cost.py`` measures what the set costs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

# Without a DSL that can install here (a CPU machine, the Triton interpreter off): what mounts the
# panel, adopts torch._native's overrides (core, calibration's gate, the compiled front) and asks
# the built-in backends whether they can run.
EXPECTED = """
_python_native_autoload
python_native
python_native.core python_native.core.arguments python_native.core.errors python_native.core.extensions
python_native.core.handles python_native.core.index python_native.core.nested_aten python_native.core.ordering
python_native.core.explainers
python_native.core.reclaim python_native.core.registry python_native.core.routers python_native.core.slots
python_native.core.variants
python_native.features
python_native.features.calibration python_native.features.calibration.first_use
python_native.features.calibration.gates python_native.features.calibration.usable_rows
python_native.features.calibration.portable python_native.features.calibration.resolve
python_native.features.calibration.sources python_native.features.calibration.tables
python_native.features.calibration.versions
python_native.features.checked
python_native.features.compiled python_native.features.compiled.mode
python_native.features.front python_native.features.front.background python_native.features.front.build
python_native.features.front.processes python_native.features.front.proof python_native.features.front.replay
python_native.foundations python_native.foundations.codegen python_native.foundations.custom_ops
python_native.foundations.dispatch_keys python_native.foundations.dsl_registry python_native.foundations.env
python_native.foundations.env_rules python_native.foundations.epilogues python_native.foundations.faults
python_native.foundations.interrupts python_native.foundations.launches python_native.foundations.logs
python_native.foundations.module_scope python_native.foundations.nvml python_native.foundations.public_names
python_native.foundations.safe_write python_native.foundations.scalars python_native.foundations.schema
python_native.foundations.source_tree python_native.foundations.switches python_native.foundations.trace_summary
python_native.foundations.tracing python_native.foundations.trust python_native.foundations.uncompiled
python_native.panel python_native.panel.bootstrap python_native.panel.dsl_support python_native.panel.mounting
python_native.panel.native_bridge
python_native_dsls python_native_dsls.cutedsl python_native_dsls.cutedsl.target python_native_dsls.triton
python_native_dsls.triton.target
""".split()
# The compiled dispatch front, where a cached build is loaded (its name carries the build's key).
FRONT_LIBRARY = re.compile(r"_python_native_front_[0-9a-f]+$")
# Modules outside torch that python-native may add to ``import torch``.
ALLOWED_THIRD_PARTY = {"packaging", "platformdirs"}
# Never during ``import torch``: DSL runtimes, and what only tools, tests or patching use.
HEAVY = ("triton", "cutlass", "tvm_ffi", "transformers", "matplotlib", "numpy", "rich", "expecttest", "scipy",
         "pandas", "liger_kernel", "quack", "mkdocs")

PROBE = """
import json, sys
import torch
ours = sorted(m for m in sys.modules if m.startswith(("python_native", "_python_native")))
print(json.dumps({"ours": ours, "top": sorted({m.partition(".")[0] for m in sys.modules}),
                  "cuda": torch.cuda.is_available()}))
"""


def _child_env(**extra: str) -> dict[str, str]:
    """No switch of ours, the Triton interpreter off: ``import torch`` as a CPU machine has it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_NATIVE_") and k != "TRITON_INTERPRET"}
    return {**env, "PYTHON_NATIVE_BACKGROUND_BUILD": "0", **extra}


def _import_torch(**extra: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=_child_env(**extra), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def mounted() -> dict:
    return _import_torch()


@pytest.fixture(scope="module")
def torch_alone() -> dict:
    return _import_torch(TORCH_DEVICE_BACKEND_AUTOLOAD="0")


def test_import_torch_loads_only_the_modules_that_install_the_overrides(mounted):
    if mounted["cuda"]:
        pytest.skip("a GPU is visible: the Triton backend installs its op library at import")
    loaded = {m for m in mounted["ours"] if not FRONT_LIBRARY.match(m)}
    joined, left = sorted(loaded - set(EXPECTED)), sorted(set(EXPECTED) - loaded)
    assert not joined, (
        "`import torch` now imports these python-native modules too (each costs every process):\n  "
        + "\n  ".join(joined)
        + "\nimport them where they are first used (lazily), or add them to EXPECTED in tests/test_import_cost.py"
    )
    assert not left, "no longer imported by `import torch` (good): take them out of EXPECTED:\n  " + "\n  ".join(left)


def test_import_torch_adds_no_heavy_third_party_module(mounted, torch_alone):
    added = set(mounted["top"]) - set(torch_alone["top"])
    heavy = sorted(name for name in HEAVY if name in added)
    assert not heavy, f"`import torch` imports {heavy} through python-native; import them on first use"
    ours = {m for m in added if m.startswith(("python_native", "_python_native"))}
    assert added - ours <= ALLOWED_THIRD_PARTY, f"python-native adds {sorted(added - ours - ALLOWED_THIRD_PARTY)}"


# Where a GPU is visible the Triton backend installs its op library at import, and its overrides of
# the custom ops (``rms_norm``, ``swiglu``, ...) import ``python_native.ops``, which declares them.
DEFERRED = """
import sys, torch
deferred = ["python_native.ops", "python_native.patching", "python_native.panel.snapshot",
            "python_native.features.checked.wrapper", "python_native.features.calibration.measure"]
if torch.cuda.is_available():
    deferred.remove("python_native.ops")
assert not [m for m in deferred if m in sys.modules], [m for m in deferred if m in sys.modules]
import torch.backends.python_native as pn
"""
FIRST_USES = {
    # The custom ops: by their op namespace, or by a public name the panel's switches take.
    "op namespace": "x = torch.randn(2, 8); assert torch.ops.python_native.swiglu(x, x).shape == (2, 8)",
    "public name": "with pn.operations_disabled('swiglu', 'rotary'): assert pn.is_operation_disabled('swiglu')",
    "custom op list": "assert 'linear_cross_entropy' in {op['op'].partition('::')[2] for op in pn.status()['custom_ops']}",
    "panel": "assert callable(pn.patch) and callable(pn.reach) and pn.PatchRule and callable(pn.linear_cross_entropy)",
    "features": ("from python_native.features import calibration, checked\n"
                 "assert checked.compare.__name__ == 'compare' and issubclass(pn.OverrideMismatch, Exception)\n"
                 "assert callable(calibration.describe) and callable(calibration.measure.decide)"),
}


@pytest.mark.parametrize("use", list(FIRST_USES), ids=list(FIRST_USES))
def test_what_import_torch_defers_works_on_first_use(use):
    code = DEFERRED + FIRST_USES[use] + "\nprint('ok')\n"
    out = subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


NO_SYSCONFIG = """
import sys, torch
for name in [m for m in sys.modules if m == "sysconfig" or m.startswith("_sysconfigdata")]:
    del sys.modules[name]  # torch may load it itself; what follows must not


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "sysconfig" or name.startswith("_sysconfigdata"):
            raise ImportError(f"{name} imported while mounting python-native or naming its compiled front")


sys.meta_path.insert(0, Refuse())
import _python_native_autoload
_python_native_autoload.mount()
from python_native.features.front import build
print(build.library_name())
"""


def test_mounting_and_naming_the_compiled_front_load_no_sysconfig():
    """``sysconfig`` loads the interpreter's build configuration: ``import torch``, which names (and may
    load) a cached compiled front, reads the extension suffix and platform without it."""
    env = _child_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", NO_SYSCONFIG], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().startswith("_python_native_front_"), out.stderr[-3000:]


def test_the_compiled_fronts_build_key_names_what_sysconfig_says():
    """The key read without ``sysconfig`` is the one it gave before: a cached front keeps its name."""
    import sysconfig

    from python_native.features.front import build

    key = build.build_key()
    assert key["python"] == sysconfig.get_config_var("SOABI")
    assert key["platform"] == sysconfig.get_platform()
    assert build.library_name().endswith(sysconfig.get_config_var("EXT_SUFFIX"))
