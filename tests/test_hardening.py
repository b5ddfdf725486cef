"""Regression tests for misuse found by adversarial use: leaks, composite ops, scalars, fork, stale kernels."""

from __future__ import annotations

import gc
import os
import threading
import weakref

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub
from python_native.core import routers
from python_native.core.registry import REGISTRY

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


@pytest.fixture(autouse=True)
def settled_dispatcher():
    """Slots emptied by earlier tests leave the dispatcher before this one looks at it (where other
    threads live, a slot left with no override stays registered for a grace period)."""
    assert REGISTRY.settle()


def _register(op: str, cond, impl, **kwargs):
    return pn.register_op_override(TEST_DSL, "aten", op, kwargs.pop("key", "CPU"), cond, impl, **kwargs)


def never(*args, **kwargs) -> bool:
    return False


# ----- remove() leaves nothing behind -----


def _cond_holding(obj: torch.Tensor):
    return lambda *args, **kwargs: bool(obj.sum() < 0)


def test_removed_override_is_unreachable_and_dispatcher_restored():
    before = torch._C._dispatch_dump("aten::sub.Tensor")
    captured = torch.ones(3)
    alive = weakref.ref(captured)
    handle = _register("sub.Tensor", _cond_holding(captured), marked_sub)
    x = torch.arange(3.0)
    assert torch.equal(torch.sub(x, x), torch.zeros(3))
    assert torch._C._dispatch_dump("aten::sub.Tensor") != before
    handle.remove()
    del handle, captured
    gc.collect()
    assert alive() is None
    assert REGISTRY.settle()  # where other threads live, the slot leaves after a grace period
    assert torch._C._dispatch_dump("aten::sub.Tensor") == before
    assert ("aten", "sub.Tensor", "CPU") not in REGISTRY.slots
    with pytest.raises(KeyError):
        pn.router_source("sub.Tensor", "CPU")
    # A later registration installs the slot again and routes.
    again = _register("sub.Tensor", always, marked_sub)
    try:
        assert torch.equal(torch.sub(x, x), torch.full((3,), 1000.0))
    finally:
        again.remove()
    assert REGISTRY.settle()
    assert torch._C._dispatch_dump("aten::sub.Tensor") == before


def _tombstones(slot) -> dict:
    """The conds of overrides removed from ``slot`` whose globals are still there, by uid."""
    return {int(n.rsplit("_", 1)[1]): fn for n, fn in slot.namespace.items() if n.startswith("_pn_cond_")}


@pytest.mark.parametrize("inside", [False, True], ids=["no-call-inside", "a-call-inside"])
def test_register_remove_cycles_do_not_grow_the_router_namespace(inside):
    """A removed override's globals go as soon as no call can look them up: at once, or once the
    call inside the slot's router (blocked in the keeper's cond here) has left."""
    entered, leave = threading.Event(), threading.Event()

    def keeper_cond(self, other, alpha=1):
        if self.numel() == 3 and float(self[0]) == 7.0:  # the blocked call's input
            entered.set()
            leave.wait(60)
        return False

    keeper = _register("sub.Tensor", keeper_cond, marked_sub)
    blocked = threading.Thread(target=torch.sub, args=(torch.full((3,), 7.0), torch.ones(3)))
    try:
        if inside:
            blocked.start()
            assert entered.wait(30)
        slot = REGISTRY.slots[("aten", "sub.Tensor", "CPU")]
        x = torch.arange(3.0)
        sizes = []
        for batch in range(3):
            for _ in range(100):
                h = _register("sub.Tensor", always, marked_sub)
                torch.sub(x, x)
                h.remove()
            tombstones = _tombstones(slot)
            assert tombstones.pop(keeper.uid) is keeper_cond
            # Kept only while a call is inside, and holding nothing of the removed overrides then.
            assert len(tombstones) == (100 * (batch + 1) if inside else 0)
            assert all(fn is routers.declined for fn in tombstones.values())
            impls = [fn for n, fn in slot.namespace.items() if n.startswith("_pn_impl_") and fn is not marked_sub]
            assert all(fn.func is routers.call_again for fn in impls)
            sizes.append((len(slot.namespace), len(slot.codes)))
        if inside:
            leave.set()
            blocked.join()
            assert REGISTRY.settle()
        else:
            assert sizes[0] == sizes[-1], sizes
        assert list(_tombstones(slot)) == [keeper.uid]
        assert len(slot.codes) <= 2, list(slot.codes)
        assert all(set(k[0]) <= {keeper.uid} for k in slot.codes)
    finally:
        leave.set()
        if blocked.is_alive():
            blocked.join()
        keeper.remove()


def test_removing_a_derived_form_slot_restores_the_dispatcher():
    names = ("aten::add.Tensor", "aten::add_.Tensor", "aten::add.out")
    before = [torch._C._dispatch_dump(n) for n in names]
    handle = _register("add.Tensor", always, lambda a, b, alpha=1: torch.sub(a, -b), derive_forms=True)
    handle.remove()
    assert REGISTRY.settle()
    assert [torch._C._dispatch_dump(n) for n in names] == before


# ----- composite ops: refused where a backend kernel would take autograd off the decomposition -----

COMPOSITES = {
    "linear": ("mm", lambda x: torch.nn.functional.linear(x, x)),
    "matmul": ("mm", lambda x: torch.matmul(x, x)),
    "narrow": ("slice", lambda x: torch.narrow(x, 1, 0, 2)),
    "chunk": ("split", lambda x: torch.chunk(x, 2, 1)[0]),
    "max_pool2d": ("max_pool2d_with_indices", lambda x: torch.nn.functional.max_pool2d(x[None, None], 2)),
    "_fused_rms_norm": ("rsqrt", lambda x: torch.nn.functional.rms_norm(x, (4,), None, 1e-6)),
}


@pytest.mark.parametrize("op", list(COMPOSITES))
def test_composite_op_without_backend_kernel_is_refused_and_left_intact(op):
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CPU"):
        pytest.skip(f"aten::{op} has a CPU kernel of its own in this build")
    piece, call = COMPOSITES[op]
    before = torch._C._dispatch_dump(f"aten::{op}"), torch._C._dispatch_dump_table(f"aten::{op}")
    with pytest.raises(ValueError, match=rf"CompositeImplicitAutograd.*AutogradCPU.*decomposes into \(.*{piece}"):
        _register(op, never, marked_sub)
    assert (torch._C._dispatch_dump(f"aten::{op}"), torch._C._dispatch_dump_table(f"aten::{op}")) == before
    assert ("aten", op, "CPU") not in REGISTRY.slots
    x = torch.randn(4, 4, requires_grad=True)
    call(x).sum().backward()
    assert x.grad is not None


def test_ops_with_their_own_autograd_kernel_stay_overridable():
    # native_layer_norm and bmm have CPU kernels and real autograd kernels: a backend kernel is safe.
    for op in ("native_layer_norm", "bmm"):
        _register(op, never, marked_sub).remove()


# ----- Python numbers reach the captured kernel as aten's wrapped numbers -----

SCALAR_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
]
NUMBERS = [True, False, 0, 1, -1, 300, 65536, 2**40, 0.5, -1e30, 1e5, 1 + 2j]
SHAPES = [(), (1,), (3,)]


def _number_calls():
    for name in ("add", "sub", "mul"):
        fn = getattr(torch, name)
        yield name, lambda t, n, fn=fn: fn(t, n)
        yield f"{name} reversed", lambda t, n, fn=fn: fn(n, t)
        if name != "mul":
            yield f"{name} alpha", lambda t, n, fn=fn: fn(t, n, alpha=2)


def _tensor(dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    base = torch.arange(1, 1 + (shape[0] if shape else 1)).reshape(shape)
    return base % 2 == 0 if dtype == torch.bool else (base * 3).to(dtype)


def _number_results() -> dict:
    results = {}
    for dtype in SCALAR_DTYPES:
        for shape in SHAPES:
            t = _tensor(dtype, shape)
            for number in NUMBERS:
                for name, call in _number_calls():
                    key = (dtype, shape, repr(number), name)
                    try:
                        r = call(t, number)
                    except Exception as e:  # noqa: BLE001 - the error type is compared with aten's
                        results[key] = type(e).__name__
                    else:
                        results[key] = (r.dtype, r.shape, r.tolist())
    return results


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_numbers_with_tensors_match_aten_through_a_declining_override():
    expected = _number_results()
    handles = [_register(op, never, marked_sub) for op in ("add.Tensor", "sub.Tensor", "mul.Tensor")]
    try:
        routed = _number_results()
    finally:
        for h in handles:
            h.remove()
    after = _number_results()
    wrong = {k: (expected[k], routed[k]) for k in expected if repr(routed[k]) != repr(expected[k])}
    assert not wrong, f"{len(wrong)} of {len(expected)} differ from aten, e.g. {list(wrong.items())[:5]}"
    assert repr(after) == repr(expected)


def test_wrapped_number_promotes_like_aten():
    from python_native.foundations import scalars

    small = torch.zeros((), dtype=torch.int8)
    assert torch.result_type(small, scalars.wrapped_number(300)) == torch.int8
    assert torch.result_type(small, scalars.wrapped_number(0.5)) == torch.get_default_dtype()
    assert scalars.wrapped_number(2**40).item() == 2**40
    assert scalars.wrapped_number(None) is None


# ----- fork while another thread holds a lock -----

_FORK_CHILD = r"""
import os, sys, threading, time, types
import torch
from packaging.version import Version
import python_native as pn
from python_native.foundations import dsl_registry, scalars, speckey
from python_native.panel import bootstrap as _bootstrap
from python_native.core.registry import REGISTRY

pn.register_dsl("forkdsl", types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("1")))
cache = speckey.SpecializationCache(lambda: 1)
locks = [REGISTRY.lock, REGISTRY.traces._lock, cache._lock, dsl_registry._lock, _bootstrap._lock, scalars._lock]
held, done = threading.Event(), threading.Event()

def hold():
    for lock in locks:
        lock.acquire()
    held.set()
    done.wait()
    for lock in reversed(locks):
        lock.release()

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    x = torch.arange(3.0)
    h = pn.register_op_override("forkdsl", "aten", "sub.Tensor", "CPU", lambda *a, **k: True, lambda a, b, alpha=1: torch.full_like(a, 1000.0))
    ok = torch.equal(torch.sub(x, x), torch.full((3,), 1000.0))
    with pn.operations_disabled("sub.Tensor"):
        ok = ok and torch.equal(torch.sub(x, x), torch.zeros(3))
    with pn.trace() as t:
        torch.sub(x, 1)
    ok = ok and cache.get("k") == 1 and t.ops() == ["sub.Tensor"]
    h.remove()
    os._exit(0 if ok else 3)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    got, status = os.waitpid(pid, os.WNOHANG)
    if got:
        done.set()
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.05)
os.kill(pid, 9)
print("child hung")
sys.exit(4)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_another_thread_holds_the_locks():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _FORK_CHILD], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])


# ----- the fallback follows the dispatcher when the captured kernel's library goes away -----


@pytest.mark.filterwarnings("ignore:.*[Oo]verrid")
def test_fallback_follows_the_dispatcher_after_its_library_is_destroyed():
    before = torch._C._dispatch_dump("aten::sub.Tensor")
    user = torch.library.Library("aten", "IMPL", "CPU")
    user.impl("sub.Tensor", lambda a, b, alpha=1: torch.full_like(a, 7.0), "CPU")
    x = torch.arange(3.0)
    routed = {"on": False}
    handle = _register("sub.Tensor", lambda *a, **k: routed["on"], marked_sub)
    try:
        assert torch.equal(torch.sub(x, x), torch.full((3,), 7.0))  # the captured user kernel
        user._destroy()
        assert torch.equal(torch.sub(x, x), torch.zeros(3))  # aten's kernel, captured again
        assert torch.equal(torch.sub(x, x), torch.zeros(3))
        routed["on"] = True
        assert torch.equal(torch.sub(x, x), torch.full((3,), 1000.0))  # still routed
    finally:
        handle.remove()
    assert REGISTRY.settle()
    assert torch._C._dispatch_dump("aten::sub.Tensor") == before


@pytest.mark.filterwarnings("ignore:.*[Oo]verrid")
def test_a_kernel_error_is_raised_once_and_not_retried():
    calls = []

    def failing(a, b, alpha=1):
        calls.append(1)
        raise RuntimeError("kernel says no")

    user = torch.library.Library("aten", "IMPL", "CPU")
    user.impl("sub.Tensor", failing, "CPU")
    handle = _register("sub.Tensor", never, marked_sub)
    try:
        with pytest.raises(RuntimeError, match="kernel says no"):
            torch.sub(torch.ones(2), torch.ones(2))
        assert len(calls) == 1
    finally:
        handle.remove()
        user._destroy()
    assert torch.equal(torch.sub(torch.ones(2), torch.ones(2)), torch.zeros(2))


def test_a_call_in_flight_when_its_override_is_removed_gets_aten_s_result():
    handle = None

    def cond_that_sees_a_removal(self, other, alpha=1):
        handle.remove()  # as if another thread removed the override right after this cond ran
        return True

    handle = _register("sub.Tensor", cond_that_sees_a_removal, marked_sub)
    x = torch.arange(3.0)
    assert torch.equal(torch.sub(x, x), torch.zeros(3))  # not NameError, not the removed impl
    assert torch.equal(torch.sub(x, x), torch.zeros(3))
