"""Replay of the Triton overrides: what the front launches for a replayed call is what the Python
path launches for the same call.

On CPU the launch path runs on the simulated device (``testing.simulated_device``: the launcher,
plans and allocations as on a GPU, Triton's compile and launch a stand-in) and replays go to the
front's stand-in launch, which records every parameter it was given. Each case is called three
times: through Python with replay off (the launches its kernels are given, described by the
launcher), once more to record, and once to replay, on fresh inputs of the same layout. Each
replayed parameter must then be the Python path's, moved to the replayed call's tensors: an input
pointer to the same offset of the new input, an output pointer to the same offset of the new
output, a scratch pointer to a buffer of its own, every number the same. On a GPU the replayed
results themselves are compared with the Python path's.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
import torch
from replay_testing import front_of, module
from triton_testing import DEVICE, requires_triton

import python_native as pn
from conftest import TEST_DSL, compiled_front_problem
from python_native.features import front
from python_native.features.front import replay
from python_native.foundations import launches
from python_native_dsls.triton import testing
from python_native_dsls.triton.ops import rms_norm as rms

pytestmark = [requires_triton, pytest.mark.override, pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem()))]
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in launch replays CPU calls")
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="replayed results need the kernels on a GPU")

aten = torch.ops.aten


def _norm_inputs(n_rows: int, n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    x, g = torch.randn(n_rows, n, dtype=dtype, device=DEVICE), torch.randn(n_rows, n, dtype=dtype, device=DEVICE)
    w, b = torch.randn(n, dtype=dtype, device=DEVICE), torch.randn(n, dtype=dtype, device=DEVICE)
    stats = torch.float32 if DEVICE == "cuda" or dtype == torch.float32 else dtype
    mean = torch.randn(n_rows, 1, dtype=stats, device=DEVICE)
    rstd = torch.rand(n_rows, 1, dtype=stats, device=DEVICE) + 0.5
    return {"x": x, "g": g, "w": w, "b": b, "mean": mean, "rstd": rstd, "rstd32": rstd.float()}


def _cases() -> dict[str, tuple[str, Callable[..., object], Callable[[], tuple]]]:
    """name -> (overridden op, call, fresh arguments of one layout)."""
    def rows(m: int, n: int, dtype: torch.dtype = torch.float32, t: bool = False) -> Callable[[], tuple]:
        def make() -> tuple:
            x = torch.randn(n, m, dtype=dtype, device=DEVICE).t() if t else torch.randn(m, n, dtype=dtype, device=DEVICE)
            return (x,)
        return make

    def grads(m: int, n: int, log: bool, dtype: torch.dtype = torch.float32) -> Callable[[], tuple]:
        def make() -> tuple:
            g = torch.randn(m, n, dtype=dtype, device=DEVICE)
            y = torch.randn(m, n, dtype=dtype, device=DEVICE)
            return (g, y if log else y.softmax(-1))
        return make

    def norm(keys: tuple[str, ...], m: int = 8, n: int = 64, dtype: torch.dtype = torch.float32) -> Callable[[], tuple]:
        return lambda: tuple(_norm_inputs(m, n, dtype)[k] for k in keys)

    def outer() -> tuple:
        return torch.randn(2, 8, 1, device=DEVICE), torch.randn(2, 1, 16, device=DEVICE)

    return {
        "softmax": ("_softmax", lambda x: aten._softmax(x, -1, False), rows(8, 64)),
        "softmax strided half": ("_softmax", lambda x: aten._softmax(x, -1, False), rows(16, 40, torch.float16, t=True)),
        "softmax long rows": ("_softmax", lambda x: aten._softmax(x, -1, False), rows(4, 9000)),
        "log_softmax": ("_log_softmax", lambda x: aten._log_softmax(x, -1, False), rows(8, 64, torch.bfloat16)),
        "softmax backward": ("_softmax_backward_data",
                             lambda g, y: aten._softmax_backward_data(g, y, -1, torch.float32), grads(8, 64, False)),
        "log_softmax backward": ("_log_softmax_backward_data",
                                 lambda g, y: aten._log_softmax_backward_data(g, y, -1, torch.float32),
                                 grads(8, 64, True)),
        "layer_norm": ("native_layer_norm", lambda x, w, b: aten.native_layer_norm(x, [64], w, b, 1e-5),
                       norm(("x", "w", "b"))),
        "layer_norm no affine": ("native_layer_norm", lambda x: aten.native_layer_norm(x, [64], None, None, 1e-5),
                                 norm(("x",))),
        "layer_norm backward": ("native_layer_norm_backward",
                                lambda g, x, mean, rstd, w, b: aten.native_layer_norm_backward(
                                    g, x, [64], mean, rstd, w, b, [True, True, True]),
                                norm(("g", "x", "mean", "rstd", "w", "b"))),
        "layer_norm backward dx only": ("native_layer_norm_backward",
                                        lambda g, x, mean, rstd, w, b: aten.native_layer_norm_backward(
                                            g, x, [64], mean, rstd, w, b, [True, False, False]),
                                        norm(("g", "x", "mean", "rstd", "w", "b"))),
        "rms_norm": ("_fused_rms_norm", lambda x, w: aten._fused_rms_norm(x, [64], w, 1e-6), norm(("x", "w"))),
        "rms_norm backward": ("_fused_rms_norm_backward",
                              lambda g, x, rstd, w: aten._fused_rms_norm_backward(g, x, [64], rstd, w, [True, True]),
                              norm(("g", "x", "rstd32", "w"))),
        "bmm outer": ("bmm", lambda a, c: aten.bmm(a, c), outer),
    }


CASES = _cases()


@pytest.fixture
def rms_at_cpu():
    """On CPU builds the RMS norm family is not installed (no CPU kernel to fall back to): give both
    ops a CPU kernel to fall back to, and install the Triton impls over it."""
    from python_native.core.registry import REGISTRY

    if DEVICE != "cpu" or ("aten", "_fused_rms_norm", "CPU") in REGISTRY.slots:
        yield
        return
    lib = torch.library.Library("aten", "IMPL")
    handles = []
    try:
        lib.impl("_fused_rms_norm", lambda *a: pytest.fail("the override declined"), "CPU")
        lib.impl("_fused_rms_norm_backward", lambda *a: pytest.fail("the override declined"), "CPU")
        for op in ("_fused_rms_norm", "_fused_rms_norm_backward"):
            built = rms.FAMILY[op]
            handles.append(pn.register_op_override(TEST_DSL, "aten", op, "CPU", built.cond, built.spec.impl,
                                                   impl_takes_plan=True))
        yield
    finally:
        for h in handles:
            h.remove()
        lib._destroy()


def _tensors(value: object) -> list[torch.Tensor | None]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _number_bits(code: str, value: float) -> int:
    if code in ("f32", "f64"):
        return int.from_bytes(struct.pack("<f" if code == "f32" else "<d", value), "little")
    size = {"i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}[code]
    return int(value) & ((1 << (8 * size)) - 1)


class _Mover:
    """Moves a Python-path pointer to the replayed call: same offset into the matching input or output."""

    def __init__(self, old_in, new_in, old_out, new_out) -> None:
        self.pairs = [(o, n) for o, n in zip(old_in, new_in, strict=True) if isinstance(o, torch.Tensor)]
        self.pairs += [(o, n) for o, n in zip(old_out, new_out, strict=True) if o is not None]
        self.scratch: dict[int, int] = {}  # Python-path storage -> replayed base

    def expected(self, t: torch.Tensor | None, got: int) -> int:
        if t is None:
            return 0
        base = t.untyped_storage().data_ptr()
        for old, new in self.pairs:
            if old.untyped_storage().data_ptr() == base:
                return new.data_ptr() + (t.data_ptr() - old.data_ptr())
        replayed_base = self.scratch.setdefault(base, got - (t.data_ptr() - base))  # scratch: its own buffer
        assert all(not (n.data_ptr() <= got < n.data_ptr() + n.untyped_storage().nbytes()) for _, n in self.pairs)
        return replayed_base + (t.data_ptr() - base)


@cpu_only
@pytest.mark.parametrize("case", list(CASES))
def test_replayed_launches_are_the_python_paths(case, rms_at_cpu):
    op, call, make = CASES[case]
    with front.serving("compiled"), testing.simulated_device():
        m = module()
        m.replay_select_test_launch(True)
        try:
            # Inputs are made outside what is logged: making them may run overrides (softmax) too.
            old_in = make()
            with launches.recording() as python_path:  # replay off: the launches the Python path makes
                old_out = _tensors(call(*old_in))
            assert python_path.launches and not python_path.problem, python_path.problem
            with replay.forced(True):
                call(*make())  # recorded
                new_in = make()
                m.replay_test_launches()
                before = front_of(op).replay_stats()["replayed"]
                new_out = _tensors(call(*new_in))  # replayed
                logged = m.replay_test_launches()
                assert front_of(op).replay_stats()["replayed"] == before + 1
        finally:
            m.replay_select_test_launch(False)
            front_of(op).replay_clear()
    for old, new in zip(old_out, new_out, strict=True):
        assert (old is None) == (new is None)
        if old is not None:
            assert (new.shape, new.stride(), new.dtype, new.device, new.storage_offset()) == (
                old.shape, old.stride(), old.dtype, old.device, old.storage_offset())
    mover = _Mover(old_in, new_in, old_out, new_out)
    assert len(logged) == len(python_path.launches)
    for want, got in zip(python_path.launches, logged, strict=True):
        assert (got["function"], got["grid"], got["block"], got["shared"], got["cluster"]) == (
            want.function, want.grid, want.block, want.shared, want.cluster)
        assert len(got["params"]) == len(want.params)
        for (code, value), bits in zip(want.params, got["params"], strict=True):
            expected = mover.expected(value, bits) if code == "p" else _number_bits(code, value)
            assert bits == expected, (code, value)


@cuda_only
@pytest.mark.parametrize("case", list(CASES))
def test_replayed_results_are_the_python_paths(case):
    op, call, make = CASES[case]
    args = make()
    with front.serving("compiled"):
        if ("aten", op, "CUDA") not in {slot.key for slot in front._state.fronts}:
            pytest.skip(f"{op} is not installed at the CUDA key here")
        with replay.forced(False):
            expected = _tensors(call(*args))
        with replay.forced(True):
            call(*args)
            before = front_of(op, "CUDA").replay_stats()["replayed"]
            got = _tensors(call(*args))
            torch.cuda.synchronize()
            assert front_of(op, "CUDA").replay_stats()["replayed"] == before + 1
    for e, g in zip(expected, got, strict=True):
        if e is not None:
            assert torch.equal(e, g)
