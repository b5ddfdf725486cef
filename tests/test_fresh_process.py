"""Fresh processes: a bad ordering function from the environment, concurrent first imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", **env}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=environ, timeout=300)


BAD_ORDER_FN = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import python_native as pn
    from python_native_dsls.triton.ops import all_overrides
expected = sorted({s.op for s in all_overrides()})
installed = sorted({o.op for o in pn.overrides() if o.dsl == "triton" and o.derived_from is None})
messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning) and "ORDER_FN" in str(w.message)]
print(json.dumps({"expected": expected, "installed": installed, "messages": messages}))
"""


def test_bad_order_fn_keeps_every_override_and_warns_once():
    r = run(BAD_ORDER_FN, PYTHON_NATIVE_ORDER_FN="nonexistent.module.fn")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["expected"] and "native_layer_norm" in out["expected"]
    assert out["installed"] == out["expected"]
    assert len(out["messages"]) == 1, out["messages"]
    message = out["messages"][0]
    assert "PYTHON_NATIVE_ORDER_FN" in message and "No module named 'nonexistent'" in message
    assert "('" not in message  # no raw tuple of variable names
    assert "not installed" not in r.stderr


CONCURRENT_IMPORTS = """
import sys, threading, traceback
errors = []
barrier = threading.Barrier(8)

def work(i):
    try:
        barrier.wait(timeout=30)
        if i % 2:
            import python_native_dsls.triton as t
            import python_native as pn
        else:
            import python_native as pn
            import python_native_dsls.triton as t
        assert pn.triton.name == "triton" and callable(t.register_overrides)
        assert "triton" in pn.all_dsls
    except BaseException:
        errors.append(traceback.format_exc())

threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
import python_native as pn
import python_native_dsls
from python_native_dsls.triton.ops import all_overrides
assert python_native_dsls.__file__.startswith(sys.argv[1]), python_native_dsls.__file__
expected = {s.op for s in all_overrides()}
installed = {o.op for o in pn.overrides() if o.dsl == "triton" and o.derived_from is None}
assert installed == expected, (installed, expected)
print("errors:", len(errors))
for e in errors:
    print(e)
"""


def test_concurrent_first_imports(tmp_path):
    # Half the threads import python_native_dsls before python_native: that name resolves on its own
    # only where the package is installed. A bare checkout on PYTHONPATH gets it from python_native's
    # import (python_native/foundations/source_tree.py), so the child is given the installed layout: the backends
    # folder under its installed name, ahead of the checkout.
    (tmp_path / "python_native_dsls").symlink_to(ROOT / "dsls", target_is_directory=True)
    r = run(CONCURRENT_IMPORTS, str(tmp_path), TORCH_DEVICE_BACKEND_AUTOLOAD="0",
            PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "errors: 0" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr, r.stderr


USER_DECLARES_FIRST = """
import torch
import python_native
from python_native.foundations import custom_ops
assert custom_ops.deferred, "the package's own ops were declared at import: nothing here to check"
op = custom_ops.declare("pn_user_twice(Tensor x) -> Tensor", reference=lambda x: x * 2, fake=torch.empty_like)
print(op(torch.ones(2)).tolist(), custom_ops.is_custom_op("swiglu"))
"""


def test_a_users_first_declaration_in_a_fresh_process_declares_the_packages_ops_too():
    # The package's ops wait for their first lookup; torch looks the namespace up while it defines
    # the user's op, under the declarations' lock: that must load them, not wait on itself.
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHON_NATIVE_TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-c", USER_DECLARES_FIRST], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[2.0,", "2.0]", "True"], proc.stdout
