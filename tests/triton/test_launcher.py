"""The launch layer: stubbed launches, serialized interpreter launches, the pre-bound GPU path."""

from __future__ import annotations

import contextlib
import threading
import types

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton_testing import DEVICE, make, requires_triton, seeded  # noqa: F401

import python_native as pn
import python_native_dsls.triton as backend
from python_native.foundations import launches
from python_native_dsls.triton import testing
from python_native_dsls.triton.kernels import compiled_kernels, launch

pytestmark = requires_triton

interpreter_only = pytest.mark.skipif(not backend.interpret_mode(), reason="about Triton's interpreter")
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs the kernels on a CUDA device")


@pytest.mark.override
def test_stubbed_launch_runs_the_routed_path_but_not_the_kernel():
    x = make(8, 64, requires_grad=False)
    with stubbed_launches_and_trace() as (names, trace):
        torch.softmax(x, -1)
    assert names == ["_softmax_fwd_kernel"]
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in trace.events if e.op == "_softmax"}
    # Outside the scope the kernel runs again.
    with pn.triton.disabled():
        ref = torch.softmax(x, -1)
    torch.testing.assert_close(torch.softmax(x, -1), ref)


class stubbed_launches_and_trace:
    def __enter__(self):
        self._stub = testing.stubbed_launches()
        self._trace = pn.trace()
        return self._stub.__enter__(), self._trace.__enter__()

    def __exit__(self, *exc):
        self._trace.__exit__(*exc)
        return self._stub.__exit__(*exc)


@triton.jit
def _mark_rows_between_kernel(OUT, first, last, BLOCK: tl.constexpr):
    for start in range(first, last, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(OUT + offs, offs, mask=offs < last)


@interpreter_only
def test_interpreter_takes_kernel_scalars_as_range_bounds():
    """The interpreter holds scalars as one-element arrays; as ``range`` bounds they index as ints
    (Triton 3.6 converts them with ``int(array)``, which numpy 2.4 and newer refuse without the fix
    in ``python_native_dsls.triton.kernels``)."""
    out = torch.full((12,), -1, dtype=torch.int32)
    _mark_rows_between_kernel[(1,)](out, 3, 10, BLOCK=4)
    assert out.tolist() == [-1, -1, -1, 3, 4, 5, 6, 7, 8, 9, -1, -1]


@interpreter_only
@pytest.mark.override
def test_interpreter_launches_from_many_threads():
    """The interpreter keeps per-launch global state: concurrent launches must be serialized."""
    inputs = [make(16, 40 + i, requires_grad=False) for i in range(6)]
    with pn.triton.disabled():
        expected = [F.softmax(x, -1) for x in inputs]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(inputs))

    def work(i: int) -> None:
        try:
            start.wait()
            for _ in range(3):
                results[i] = F.softmax(inputs[i], -1)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    with pn.trace() as trace:  # records the calls of every thread
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert trace.ops("override").count("_softmax") == 3 * len(inputs), trace.summary()
    for i, ref in enumerate(expected):
        torch.testing.assert_close(results[i], ref)


def test_spec_key_follows_what_triton_specializes_on():
    base = torch.empty(64)
    key = launch.spec_key
    assert key((base, 5)) == key((torch.empty(64), 7))
    assert key((base, 5)) != key((base[1:], 5))  # a pointer no longer 16-byte aligned
    assert key((base, 5)) != key((base.half(), 5))  # dtype
    assert key((base, 5)) != key((base, 1))  # ints equal to 1 are compile-time constants
    assert key((base, 5)) != key((base, 32))  # divisibility by 16
    assert key((base, 5)) != key((base, 2**40))  # 64-bit ints
    assert key((base, None)) != key((base, 5))
    # Parameters key by layout like plain tensors: the cache must not hold on to the objects.
    param = torch.nn.Parameter(torch.empty(64))
    assert key((param, 5)) == key((base, 5)) and all(k is not param for k in key((param, 5)))


class _FakeCompiled:
    def __init__(self):
        self.function, self.packed_metadata, self.calls = object(), object(), []

    def run(self, *args):
        self.calls.append(args)


class _FakeKernel:
    """Stands for a JITFunction: records normal launches, returns one compiled kernel per call."""

    def __init__(self):
        self.params = [types.SimpleNamespace(name=n, is_constexpr=n.isupper()) for n in ("x", "n", "LOG", "BLOCK")]
        self.pre_run_hooks: list = []
        self.normal: list = []
        self.compiled = _FakeCompiled()

    def __getitem__(self, grid):
        def launch_(*args, **kwargs):
            self.normal.append((grid, args, kwargs))
            return self.compiled

        return launch_


@pytest.fixture
def gpu_like(monkeypatch):
    """Pretend CPU tensors (device -1) live on the current CUDA device, to drive the GPU path here."""
    monkeypatch.setattr(launch.STATE, "interpret", False)
    monkeypatch.setattr(launch.STATE, "not_cuda", -2)
    monkeypatch.setattr(launch.STATE, "current_device", lambda: -1)
    monkeypatch.setattr(launch.STATE, "raw_stream", lambda index: 1234)


def test_prebound_path_reuses_the_compiled_kernel(gpu_like):
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    x = torch.empty(64)
    launcher((3,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 1 and not kernel.compiled.calls
    grid, args, kwargs = kernel.normal[0]
    assert grid == (3,) and args == (x, 64) and kwargs == {"num_warps": 4, "LOG": True, "BLOCK": 128}

    launcher((5,), (x, 80), 4, True, 128)  # same specialization: straight to the compiled launcher
    assert len(kernel.normal) == 1
    c = kernel.compiled
    assert c.calls == [(5, 1, 1, 1234, c.function, c.packed_metadata, None, None, None, x, 80, True, 128)]

    launcher((5,), (x, 1), 4, True, 128)  # n == 1 compiles another variant: the normal path
    launcher((5,), (x, 80), 8, True, 128)  # other warps
    launcher((5,), (x, 80), 4, False, 128)  # other constexpr
    assert len(kernel.normal) == 4


def test_prebound_path_steps_aside_for_hooks(gpu_like):
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    x = torch.empty(64)
    launcher((1,), (x, 64), 4, True, 128)
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    launcher((1,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 2 and not kernel.compiled.calls


@pytest.mark.parametrize(
    "idle, installed",
    [(None, lambda *a: None), (types.SimpleNamespace(calls=[]), types.SimpleNamespace(calls=[lambda *a: None]))],
    ids=["triton-3.6-style", "hook-chain"],
)
@pytest.mark.parametrize("which", ["launch_enter_hook", "launch_exit_hook"])
def test_planned_launch_steps_aside_for_launch_hooks(gpu_like, idle, installed, which):
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    runtime = types.SimpleNamespace(launch_enter_hook=idle, launch_exit_hook=idle)
    launcher._runtime_knobs = runtime
    x = torch.empty(64)
    for _ in range(3):  # bind, then two direct launches
        launcher.planned("p", (1,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 1 and len(kernel.compiled.calls) == 2
    setattr(runtime, which, installed)  # a profiler hooks in: every launch must reach Triton's path
    launcher.planned("p", (1,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 2 and len(kernel.compiled.calls) == 2


def test_launcher_rejecting_the_call_disables_the_prebound_path(gpu_like):
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    x = torch.empty(64)
    launcher((1,), (x, 64), 4, True, 128)

    def reject(*args):
        raise TypeError("function takes exactly 27 arguments (19 given)")

    launcher._compiled.update({key: (reject, prefix) for key, (_, prefix) in launcher._compiled.items()})
    launcher((1,), (x, 64), 4, True, 128)  # falls back to Triton's own path
    launcher((1,), (x, 64), 4, True, 128)  # and stays there
    assert len(kernel.normal) == 3 and not launcher._fast


def test_planned_launch_keys_on_the_plan_and_pointer_alignment(gpu_like):
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    x, c = torch.empty(64), kernel.compiled
    launcher.planned("plan-a", (3,), (x, 64), 4, True, 128)  # first: Triton's path, then bound to the plan
    assert len(kernel.normal) == 1 and not c.calls
    launcher.planned("plan-a", (2,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 1
    assert c.calls == [(2, 1, 1, 1234, c.function, c.packed_metadata, None, None, None, x, 64, True, 128)]

    misaligned = torch.empty(65)[1:]  # 4 bytes past an aligned allocation
    launcher.planned("plan-a", (2,), (misaligned, 64), 4, True, 128)
    assert len(kernel.normal) == 2  # not the plan's variant: the generic path decides
    launcher.planned("plan-b", (2,), (x, 64), 4, True, 128)  # a new plan binds to the known variant
    assert len(kernel.normal) == 2 and len(c.calls) == 2
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    launcher.planned("plan-a", (2,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 3  # hooks: Triton's own path


class _FakeOutputKernel(_FakeKernel):
    """A kernel with an input and an output pointer: ``(x, y, n, LOG, BLOCK)``."""

    def __init__(self):
        super().__init__()
        self.params = [types.SimpleNamespace(name=n, is_constexpr=n.isupper()) for n in ("x", "y", "n", "LOG", "BLOCK")]


def test_fresh_outputs_must_name_kernel_parameters():
    with pytest.raises(ValueError, match=r"\['out'\] are not parameters of the kernel"):
        launch.Launcher(_FakeOutputKernel(), ("LOG", "BLOCK"), fresh=("out",))


def test_planned_launch_checks_the_inputs_alignment_but_not_fresh_outputs(gpu_like):
    kernel = _FakeOutputKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"), fresh=("y",))
    x, y, c = torch.empty(64), torch.empty(64), kernel.compiled
    launcher.planned("p", (1,), (x, y, 64), 4, True, 128)  # binds the plan
    launcher.planned("p", (1,), (x, y, 64), 4, True, 128)
    assert len(kernel.normal) == 1 and len(c.calls) == 1
    launcher.planned("p", (1,), (torch.empty(65)[1:], y, 64), 4, True, 128)  # a misaligned input
    assert len(kernel.normal) == 2  # Triton's path decides
    assert launcher._planned["p"][3] == (0,)  # only the input's alignment is checked per call
    launcher.planned("q", (2, 3), (x, y, 64), 4, True, 128)
    launcher.planned("q", (2, 3), (x, y, 64), 4, True, 128)  # a 2-D grid, padded to three dims
    assert c.calls[-1][:4] == (2, 3, 1, 1234)


def test_planned_launch_on_another_device_takes_the_generic_path(gpu_like, monkeypatch):
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    x = torch.empty(64)
    launcher.planned("p", (1,), (x, 64), 4, True, 128)
    assert launcher._planned["p"][0] == -1
    monkeypatch.setattr(launch.STATE, "current_device", lambda: 1)  # the user switched devices
    entered = []
    monkeypatch.setattr(launch.torch.cuda, "device", lambda index: entered.append(index) or contextlib.nullcontext())
    launcher.planned("p", (1,), (x, 64), 4, True, 128)
    assert len(kernel.normal) == 2 and not kernel.compiled.calls and entered == [-1]


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors reach the overrides only where they sit at the CPU key "
                    "(Triton's interpreter); on a GPU the real launch path runs instead")
@pytest.mark.override
def test_simulated_device_runs_the_routed_gpu_path_on_cpu_tensors():
    from python_native_dsls.triton.kernels.softmax_rows import FWD

    x = torch.randn(8, 64)
    saved = (launch.STATE.interpret, launch.STATE.not_cuda, launch.STATE.current_device, launch.STATE.launch)
    with testing.simulated_device() as names:
        torch.softmax(x, -1)  # the first call of a plan: the stand-in for Triton's compile and launch
        torch.softmax(x, -1)  # then the bound launcher, through the plan's fast path
        assert names == ["_softmax_fwd_kernel"] * 2
        assert len(FWD._planned) == 1 and FWD._fast
    assert (launch.STATE.interpret, launch.STATE.not_cuda, launch.STATE.current_device, launch.STATE.launch) == saved
    assert not FWD._planned and not FWD._compiled  # nothing bound inside survives
    assert FWD._fast == (not backend.interpret_mode() and FWD._layout_ok())


class _FakeCudaLauncher:
    """Triton 3.6's launcher object as the direct path reads it: the C ``launch`` and its fields."""

    def __init__(self, scratch: int):
        self.calls: list = []
        self.launch = lambda *args: self.calls.append(args)
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = True


@pytest.mark.parametrize("version, scratch, direct", [("3.6.0", 0, True), ("3.6.0", 256, False), ("3.9.0", 0, False)])
def test_bind_calls_the_c_launcher_directly_only_where_its_layout_is_known(monkeypatch, version, scratch, direct):
    monkeypatch.setattr(compiled_kernels.triton, "__version__", version)
    compiled = types.SimpleNamespace(run=_FakeCudaLauncher(scratch), function=7, packed_metadata=(4, 1, 0))
    fn, prefix = compiled_kernels.bind(compiled)
    if direct:
        assert fn is compiled.run.launch
        assert prefix == (7, False, True, None, None, (4, 1, 0), None, None, None)
    else:
        assert fn is compiled.run and prefix == (7, (4, 1, 0), None, None, None)


def test_tensor_on_another_device_switches_to_it_for_the_launch(gpu_like, monkeypatch):
    entered = []

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        yield

    monkeypatch.setattr(launch.STATE, "current_device", lambda: 0)  # the tensor (device -1) is elsewhere
    monkeypatch.setattr(launch.torch.cuda, "device", device)
    kernel = _FakeKernel()
    launcher = launch.Launcher(kernel, ("LOG", "BLOCK"))
    launcher((1,), (torch.empty(4), 4), 4, True, 128)
    assert entered == [-1] and len(kernel.normal) == 1


def test_launcher_refuses_a_misdeclared_constexpr_order():
    kernel = _FakeKernel()
    assert not launch.Launcher(kernel, ("BLOCK", "LOG"))._layout_ok()
    assert launch.Launcher(kernel, ("LOG", "BLOCK"))._layout_ok()


@cuda_only
@pytest.mark.override
def test_gpu_second_call_takes_the_prebound_path():
    from python_native_dsls.triton.kernels.softmax_rows import FWD

    x = make(8, 64, requires_grad=False)
    with pn.triton.disabled():
        ref = torch.softmax(x, -1)
    torch.testing.assert_close(torch.softmax(x, -1), ref)
    assert FWD._compiled, "the first launch should have kept its compiled kernel"
    y = torch.softmax(x.clone(), -1)
    torch.testing.assert_close(y, ref)


def test_new_contiguous_allocates_fresh_row_major_outputs():
    from python_native_dsls.triton.kernels.alloc import new_contiguous

    like = torch.empty(3, 5, dtype=torch.float16)
    a = new_contiguous(like, (4, 1, 6), torch.float32)
    b = new_contiguous(like, (4, 1, 6), torch.float32)
    assert a.shape == (4, 1, 6) and a.dtype == torch.float32 and a.device == like.device
    assert a.is_contiguous() and a.stride() == (6, 6, 1)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()  # never shared
    assert a.untyped_storage().nbytes() == 4 * 6 * 4  # its own storage, the template's is one element


class _Run:
    """A compiled kernel's launcher: callable, with the fields Triton 3.6's has."""

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)

    def __call__(self, *args: object) -> None:
        pass


def _compiled_kernel(signature: dict, scratch: int = 0, **run: object) -> types.SimpleNamespace:
    """Triton 3.6's compiled kernel as ``describe`` reads it: handle, metadata, signature, launcher fields."""
    fields = {"global_scratch_size": scratch, "profile_scratch_size": 0, "launch_cooperative_grid": False,
              "launch_pdl": True, **run}
    return types.SimpleNamespace(function=0xABC, packed_metadata=(4, 2, 1024), src=types.SimpleNamespace(signature=signature),
                                 run=_Run(**fields))


def test_a_described_launch_follows_the_kernel_signature_as_tritons_launcher_does():
    signature = {"X": "*fp32", "Y": "*fp16", "n": "i32", "big": "i64", "one": "constexpr", "eps": "fp32",
                 "flag": "u1", "none": "constexpr", "BLOCK": "constexpr"}
    x, y = torch.empty(4), torch.empty(4, dtype=torch.float16)
    found = compiled_kernels.describe(_compiled_kernel(signature), (3, 2), (x, y, 7, 2**40, 1, 1e-5, True, None, 128))
    assert found == launches.Launch(
        function=0xABC, grid=(6, 2, 1), block=(128, 1, 1), shared=1024, cluster=(2, 1, 1), cooperative=False,
        pdl=True, params=(("p", x), ("p", y), ("i32", 7), ("i64", 2**40), ("f32", 1e-5), ("u8", 1), ("p", None),
                          ("p", None)),
    )


@pytest.mark.parametrize("compiled, values, says", [
    (_compiled_kernel({"X": "*fp32"}, scratch=64), (None,), "scratch memory"),
    (_compiled_kernel({"X": "*fp32"}, gsan_enabled=True), (None,), "instrumented"),
    (_compiled_kernel({"X": ("*fp32", "*fp32")}), ((None, None),), "tuple parameter"),
    (_compiled_kernel({"D": "nvTmaDesc"}), (object(),), "parameter type nvTmaDesc"),
    (_compiled_kernel({"X": "*fp32"}), (12345,), "a pointer given as int"),
    (_compiled_kernel({"X": "*fp32", "n": "i32"}), (None,), "1 values for 2 parameters"),
    (types.SimpleNamespace(function=None), (), "no compiled kernel"),
])
def test_a_launch_replay_cannot_repeat_is_refused_with_why(compiled, values, says):
    assert says in compiled_kernels.describe(compiled, (1,), values)


def test_an_unknown_tritons_launches_are_not_described(monkeypatch):
    monkeypatch.setattr(compiled_kernels.triton, "__version__", "3.5.1")
    assert "3.5.1" in compiled_kernels.describe(_compiled_kernel({"X": "*fp32"}), (1,), (None,))


@pytest.mark.override
def test_recording_through_the_interpreter_refuses_and_still_launches():
    x = make(8, 64, requires_grad=False)
    with pn.triton.disabled():
        ref = torch.softmax(x, -1)
    with launches.recording() as rec:
        out = torch.softmax(x, -1)
    torch.testing.assert_close(out, ref)
    if backend.interpret_mode():
        assert "_softmax_fwd_kernel launched through the interpreter" in rec.problem and not rec.launches
    else:
        assert not rec.problem and len(rec.launches) == 1
