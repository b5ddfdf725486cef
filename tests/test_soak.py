"""A minute of everything at once: threads calling overridden ops while others toggle, open scopes
and traces, register and remove overrides, switch compile mode and call compiled code, with
checked-mode overrides among them. Every result is checked in the thread that got it; afterwards
the status report is what it was before and resident memory did not grow.

It runs in a child process (a crash fails the test, not the suite), once per suite run
(``-m "not soak"`` leaves it out, and so does the README's ``-m "not slow"``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOAK_SECONDS = int(os.environ.get("SOAK_TEST_SECONDS", "60"))
# Removing a slot's *last* override while other threads call that op: the slot leaves the
# dispatcher at once, and what a call may still be inside is freed only once none can be
# (``core.reclaim``), so the soak does it too.
REMOVE_LAST_OVERRIDE_UNDER_CALLERS = True
# Resident memory may grow this much from the end of the warm-up to the end (allocator caches,
# interned strings); a leak of a router or a tensor per call or per cycle is far beyond it.
MAX_RSS_GROWTH_MB = 16

pytestmark = [pytest.mark.soak, pytest.mark.slow]

SOAK = r"""
import json, os, random, sys, threading, time, traceback, types
import torch, torch.nn.functional as F
from packaging.version import Version
import python_native as pn

SECONDS, REMOVE_LAST = float(sys.argv[1]), sys.argv[2] == "1"
for name in ("soak", "soaktwo"):
    pn.register_dsl(name, types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("1")))


def status_key():
    s = pn.status()
    # Compile mode's opaque twins of overridden ops are defined once, on first use, and stay: only
    # the mode and what compiled graphs call count.
    s["compile"] = {k: s["compile"][k] for k in ("mode", "in_compiled_graphs")}
    return {k: json.dumps(s.get(k), sort_keys=True, default=str)
            for k in ("dsls", "overrides", "environment", "problems", "compile")}


def rss_mb():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return None


start_status = status_key()
x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
w, b = torch.rand(32) + 0.5, torch.randn(32)

# Overrides of the soak's own: exact replacements of aten, so every result has one right value
# whatever is switched on. (sub: a - b == a + (-1) * b; mul: 0 + a * b == a * b, bit for bit.)
sub_impl = lambda a, o, alpha=1: torch.add(a, o, alpha=-alpha)  # noqa: E731
mul_impl = lambda a, o: torch.addcmul(torch.zeros_like(a), a, o)  # noqa: E731
tensors = lambda a, o, **k: (isinstance(a, torch.Tensor) and isinstance(o, torch.Tensor) and a.shape == o.shape  # noqa: E731
                             and a.dtype == o.dtype == torch.float32)
KEEPERS = [
    pn.register_op_override("soak", "aten", "sub.Tensor", "CPU", tensors, sub_impl),
    pn.register_op_override("soak", "aten", "mul.Tensor", "CPU", tensors, mul_impl),
]

def calls():
    yield "sub", lambda: torch.sub(x, x * 0.5)
    yield "mul", lambda: torch.mul(x, x)
    yield "softmax", lambda: F.softmax(x, -1)
    yield "gelu", lambda: F.gelu(x)
    yield "layer_norm", lambda: F.layer_norm(x, (32,), w, b)
    if REMOVE_LAST:
        yield "neg", lambda: torch.neg(x)

with pn.triton.disabled(), pn.soak.disabled(), pn.soaktwo.disabled():
    EXPECTED = {name: fn() for name, fn in calls()}
    leaf = x.clone().requires_grad_()
    F.gelu(leaf).backward(x)
    GELU_GRAD = leaf.grad
EXACT = {"sub", "mul", "neg"}

stop = threading.Event()
errors, counts, lock = [], {}, threading.Lock()


def count(what, n=1):
    with lock:
        counts[what] = counts.get(what, 0) + n


def worker(fn):
    def run():
        rng = random.Random(threading.get_ident())
        try:
            while not stop.is_set():
                fn(rng)
        except BaseException:
            errors.append(traceback.format_exc())
            stop.set()
    return threading.Thread(target=run, daemon=True)


def call(rng):
    for name, fn in calls():
        got = fn()
        want = EXPECTED[name]
        ok = torch.equal(got, want) if name in EXACT else torch.allclose(got, want, rtol=1e-5, atol=1e-6)
        if not ok:
            raise AssertionError(f"{name}: {got} != {want}")
    leaf = x.clone().requires_grad_()
    F.gelu(leaf).backward(x)
    assert torch.allclose(leaf.grad, GELU_GRAD, rtol=1e-5, atol=1e-6), "gelu backward"
    count("calls")


def toggle(rng):
    choice = rng.randrange(5)
    if choice == 0:
        pn.triton.enabled = rng.random() < 0.5
    elif choice == 1:
        getattr(pn, rng.choice(["soak", "soaktwo"])).disable()
    elif choice == 2:
        pn.disable_operations(rng.choice(["sub", "mul.Tensor", "softmax", "_softmax", "gelu"]))
    elif choice == 3:
        pn.disable_dispatch_keys("CPU")
    else:
        pn.triton.enable(); pn.soak.enable(); pn.soaktwo.enable()
        pn.enable_operations("sub", "mul.Tensor", "softmax", "_softmax", "gelu")
        pn.enable_dispatch_keys("CPU")
    count("toggles")
    time.sleep(0.001)


def scope(rng):
    scopes = [lambda: pn.operations_disabled("sub", "_softmax"), lambda: pn.triton.disabled(),
              lambda: pn.soak.disabled(), lambda: pn.dispatch_keys_disabled("CPU"), pn.trace]
    with rng.choice(scopes)(), rng.choice(scopes)():
        torch.sub(x, x)
    count("scopes")


def register(rng):
    os.environ["PYTHON_NATIVE_CHECK"] = "1" if rng.random() < 0.5 else "0"  # checked mode, read at registration
    op, impl = rng.choice([("sub.Tensor", sub_impl), ("mul.Tensor", mul_impl)])
    h = pn.register_op_override(rng.choice(["soak", "soaktwo"]), "aten", op, "CPU", tensors, impl,
                                priority=rng.randrange(-2, 3))
    time.sleep(0.002)
    h.remove()
    if REMOVE_LAST:  # the only override of neg, removed while callers call neg
        pn.register_op_override("soak", "aten", "neg", "CPU", None, lambda a: torch.sub(0, a), unconditional_override=True).remove()
    count("cycles")


compiled = torch.compile(lambda t: F.softmax(t, -1) * 2, backend="aot_eager")


def compile_mode(rng):
    with pn.compile_mode_set(rng.choice(["keep", "bypass"])):
        got = compiled(x)
    assert torch.allclose(got, EXPECTED["softmax"] * 2, rtol=1e-5, atol=1e-6), "compiled softmax"
    count("compiled calls")


threads = [worker(call) for _ in range(3)] + [worker(f) for f in (toggle, scope, register, compile_mode)]
for t in threads:
    t.start()
time.sleep(SECONDS / 4)
warm = rss_mb()
time.sleep(SECONDS * 3 / 4)
stop.set()
for t in threads:
    t.join(60)
stuck = sum(t.is_alive() for t in threads)
end = rss_mb()
pn.triton.enable(); pn.soak.enable(); pn.soaktwo.enable()
pn.enable_operations("sub", "mul.Tensor", "softmax", "_softmax", "gelu")
pn.enable_dispatch_keys("CPU")
for h in KEEPERS:
    h.remove()
os.environ.pop("PYTHON_NATIVE_CHECK", None)
print(json.dumps({
    "errors": errors[:3], "counts": counts, "stuck": stuck,
    "status_changed": {k: [start_status[k], v] for k, v in status_key().items() if v != start_status[k]},
    "rss_growth_mb": None if warm is None else end - warm,
}))
"""


@pytest.mark.parametrize("front", ["python", "compiled"])
def test_a_minute_of_everything_at_once(front):
    if front == "compiled":
        from conftest import compiled_front_problem

        if compiled_front_problem() is not None:
            pytest.skip(compiled_front_problem())
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
               "PYTHON_NATIVE_FRONT": front}
    environ.pop("PYTHON_NATIVE_CHECK", None)
    r = subprocess.run(
        [sys.executable, "-c", SOAK, str(SOAK_SECONDS), "1" if REMOVE_LAST_OVERRIDE_UNDER_CALLERS else "0"],
        capture_output=True, text=True, env=environ, timeout=SOAK_SECONDS + 240,
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-4000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == [], out["errors"][0]
    assert out["stuck"] == 0
    counts = out["counts"]
    for what in ("calls", "toggles", "scopes", "cycles", "compiled calls"):
        assert counts.get(what, 0) >= 10, counts  # every kind of work really ran, many times
    assert out["status_changed"] == {}
    if out["rss_growth_mb"] is not None:
        assert out["rss_growth_mb"] < MAX_RSS_GROWTH_MB, out
