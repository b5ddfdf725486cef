"""The launcher every kernel goes through, and what the kernels share besides (a rounding cast).

``Launcher`` replaces ``kernel[grid](...)`` on the hot path. Triton's ``JITFunction.run`` binds and
specializes every argument on every call; after the first launch of a variant the launcher keeps
the compiled kernel under a cheap key (constexprs, warps, and per argument what Triton specializes
on: dtype and 16-byte alignment of pointers, ``== 1`` / divisibility by 16 / width of ints) and
calls its low-level launcher directly, the way ``JITFunction.run`` itself does. Anything unusual
(the interpreter, launch hooks, pre-run hooks, a Triton whose compiled kernels lack the expected
members, a tensor on a device other than the current one) takes the normal path. Under the
interpreter, which is not thread-safe, launches are serialized.
"""

from __future__ import annotations

import contextlib
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from python_native.foundations import logs

from ..target import dispatch_key, interpret_mode

# Triton's interpreter truncates fp32 -> bf16 where GPUs round to nearest even; under the
# interpreter the kernels round explicitly so that results match what a GPU produces.
_ROUND_BF16 = tl.constexpr(interpret_mode())


@triton.jit
def cast_out(x, dtype: tl.constexpr):
    """``x.to(dtype)`` with round-to-nearest-even, also under the interpreter."""
    if _ROUND_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


# ---------------------------------------------------------------------------------------------
# Launching

LaunchStub = Callable[["Launcher", tuple, tuple, int, Sequence[Any]], None]

# A replacement for the final launch (benchmarks measure everything up to it); None launches.
_launch_stub: LaunchStub | None = None
# Triton's interpreter keeps global state per launch: concurrent launches corrupt each other.
_INTERPRETER_LOCK = threading.Lock()
_INTERPRET = interpret_mode()
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# What ``_cuda_device_of`` answers for a tensor that is not on a CUDA device (``simulated_device``
# moves it, so that CPU tensors, whose ``get_device()`` is -1, count as on a device).
_NOT_CUDA = -1
_Tensor = torch.Tensor
# Compiled variants kept per kernel; past this many the table starts over (Triton keeps its own).
_MAX_VARIANTS = 256
_LAUNCHERS: weakref.WeakSet[Launcher] = weakref.WeakSet()  # every launcher, for ``simulated_device``


@contextlib.contextmanager
def stubbed_launches(stub: LaunchStub | None = None) -> Iterator[list[str]]:
    """Replace every kernel launch with ``stub`` (default: record the kernel name and return).

    Everything before the launch still runs: routing, conds, plans, output allocation, argument
    preparation. Yields the list of recorded kernel names (default stub only).
    """
    global _launch_stub
    names: list[str] = []

    def record(launcher: Launcher, grid: tuple, args: tuple, num_warps: int, constexprs: Sequence[Any]) -> None:
        names.append(launcher.name)

    previous, _launch_stub = _launch_stub, stub or record
    try:
        yield names
    finally:
        _launch_stub = previous


@contextlib.contextmanager
def simulated_device() -> Iterator[list[str]]:
    """Run the GPU launch path on CPU tensors, Triton's compile and launch replaced by a no-op.

    CPU tensors count as on the current device; a first launch returns a stand-in compiled kernel
    whose launcher records the kernel's name and returns. Everything else a GPU call does in Python
    runs as on a GPU: plans, allocations, launch keys, device, hook and alignment checks, the bound
    launcher's call. Benchmarks time the host path of a hit with it on machines without a GPU.
    Launchers forget what they bound on entry and on exit. Yields the recorded kernel names.
    """
    global _INTERPRET, _NOT_CUDA, _current_device, _raw_stream
    names: list[str] = []
    compiled_for: dict[str, Any] = {}

    def fake_launch(launcher: Launcher, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> Any:
        name = launcher.name
        if name not in compiled_for:
            compiled_for[name] = types.SimpleNamespace(
                function=name, packed_metadata=None, run=lambda *call: names.append(name)
            )
        names.append(name)
        return compiled_for[name]

    saved = (_INTERPRET, _NOT_CUDA, _current_device, _raw_stream)
    real_launch = Launcher._launch
    launchers = list(_LAUNCHERS)
    fast = {launcher: launcher._fast for launcher in launchers}
    _INTERPRET, _NOT_CUDA, _current_device, _raw_stream = False, -2, (lambda: -1), (lambda index: 0)
    Launcher._launch = fake_launch  # type: ignore[method-assign]
    for launcher in launchers:
        launcher._forget_bindings()
        launcher._fast = launcher._layout_ok()
    try:
        yield names
    finally:
        _INTERPRET, _NOT_CUDA, _current_device, _raw_stream = saved
        Launcher._launch = real_launch  # type: ignore[method-assign]
        for launcher in launchers:
            launcher._forget_bindings()
            launcher._fast = fast[launcher]


def _spec_key(args: tuple) -> tuple:
    """What Triton specializes a runtime argument on, for every argument (see module docstring).

    Ints key as a small code (1: equal to 1; 2: a multiple of 16; 0: neither; +3 outside int32),
    tensors as ``(dtype, 16-byte aligned)``; other values (None, bools) key by themselves: Triton
    treats them as compile-time values. One plain loop: this runs on every GPU launch.
    """
    key = []
    append = key.append
    for a in args:
        cls = a.__class__
        if cls is _Tensor:
            append((a.dtype, not a.data_ptr() & 15))
        elif cls is int:
            code = 1 if a == 1 else 0 if a % 16 else 2
            append(code if _INT32_MIN <= a <= _INT32_MAX else code + 3)
        elif cls is float:
            append(float)
        elif isinstance(a, _Tensor):  # parameters and other subclasses: never the object itself
            append((a.dtype, not a.data_ptr() & 15))
        else:
            append(a)
    return tuple(key)


_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)


class Launcher:
    """One ``@triton.jit`` kernel with its constexpr parameter names (the trailing parameters).

    Call it as ``launcher(grid, args, num_warps, *constexpr_values)``: ``args`` are the runtime
    arguments in declaration order, the first of them a tensor on the launch device; the
    constexpr values follow in ``constexprs`` order. ``fresh`` names the pointer parameters every
    caller passes a tensor it has just allocated (an output): the allocator aligns those, so a
    planned launch does not check their alignment again. ``op`` names the op(s) the kernel serves,
    for compile events (``TORCH_LOGS=python_native_compile``): the first launch of each variant
    (constexprs and warps, per device) is its compile, timed and logged.
    """

    def __init__(self, kernel: Any, constexprs: Sequence[str], fresh: Sequence[str] = (), op: str | None = None) -> None:
        self.kernel = kernel
        self.constexprs = tuple(constexprs)
        self._params = _declared_params(kernel)
        names = [name for name, _ in self._params or ()]
        unknown = [name for name in fresh if name not in names]
        if unknown:
            raise ValueError(f"fresh={list(fresh)!r}: {unknown} are not parameters of the kernel ({names})")
        self._fresh = frozenset(names.index(name) for name in fresh)
        self.name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "kernel")
        self.op = op or self.name
        self._launched: set[tuple] = set()  # variants launched once (compiled), for compile events
        self._compiled: dict[tuple, Any] = {}
        # plan -> (device, launch, prefix, positions of the tensors whose alignment each call checks)
        self._planned: dict[Any, tuple] = {}
        self._fast = not _INTERPRET and self._layout_ok()
        self._runtime_knobs: Any = None  # triton.knobs.runtime, read once the fast path first runs
        self._verified = False  # a direct launch has succeeded: its errors are real ones
        _LAUNCHERS.add(self)

    def _layout_ok(self) -> bool:
        """The fast path passes runtime args then constexprs: the kernel must declare them so."""
        params = self._params
        if params is None:
            return False
        n = len(self.constexprs)
        runtime, trailing = params[: len(params) - n], params[len(params) - n :]
        return [name for name, _ in trailing] == list(self.constexprs) and all(c for _, c in trailing) and not any(
            c for _, c in runtime
        )

    def __call__(self, grid: tuple, args: tuple, num_warps: int, *constexprs: Any) -> None:
        if _launch_stub is not None:
            _launch_stub(self, grid, args, num_warps, constexprs)
            return
        if _INTERPRET:
            with _INTERPRETER_LOCK:
                self._noted_launch(-1, grid, args, num_warps, constexprs)
            return
        device = _cuda_device_of(args)
        if device == _NOT_CUDA:  # not a CUDA tensor: Triton's own path reports it
            self._launch(grid, args, num_warps, constexprs)
            return
        if device != _current_device():
            # Triton launches on the current device; switch only when the tensor is elsewhere.
            with torch.cuda.device(device):
                self._noted_launch(device, grid, args, num_warps, constexprs)
            return
        if not self._fast:
            self._noted_launch(device, grid, args, num_warps, constexprs)
            return
        key = (device, constexprs, num_warps, _spec_key(args))
        bound = self._compiled.get(key)
        if bound is not None and self._hooks_idle():
            self._launch_bound(bound[0], bound[1], device, grid, args, num_warps, constexprs)
            return
        compiled = self._noted_launch(device, grid, args, num_warps, constexprs)
        if _compiled_usable(compiled):
            if len(self._compiled) >= _MAX_VARIANTS:
                self._compiled.clear()
            self._compiled[key] = _bind(compiled)

    def planned(self, plan: Any, grid: tuple, args: tuple, num_warps: int, *constexprs: Any) -> None:
        """``self(grid, args, num_warps, *constexprs)`` for callers that hold a plan key.

        ``plan`` is any hashable that determines everything Triton specializes on except pointer
        alignment: the tensors' dtypes, every int argument, ``num_warps`` and the constexprs (a
        row kernel's rows, dtypes and flags, say). Once a plan has launched, a call is one dict
        read, the device and hook checks, the alignment of the tensor arguments (fresh outputs
        excepted), and the compiled launcher. Anything off that path (stubs, the interpreter,
        another device, a misaligned pointer, hooks) goes through ``__call__``.
        """
        entry = self._planned.get(plan)
        if entry is not None and _launch_stub is None:
            device, launch, prefix, pointers = entry
            if args[0].get_device() == device and _current_device() == device and self._hooks_idle():
                for i in pointers:
                    if args[i].data_ptr() & 15:
                        break
                else:
                    if len(grid) == 1 and self._verified:  # the common case, without a frame of its own
                        launch(grid[0], 1, 1, _raw_stream(device), *prefix, *args, *constexprs)
                    else:
                        self._launch_bound(launch, prefix, device, grid, args, num_warps, constexprs)
                    return
        self._planned_slow(plan, grid, args, num_warps, constexprs)

    def _planned_slow(self, plan: Any, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> None:
        """A planned call off the fast path: stubbed, interpreted, first of its plan, or unusual."""
        if _launch_stub is not None:
            _launch_stub(self, grid, args, num_warps, constexprs)
            return
        self(grid, args, num_warps, *constexprs)
        if not _INTERPRET and self._fast:
            device = _cuda_device_of(args)
            if device != _NOT_CUDA and device == _current_device():
                self._remember_plan(device, plan, args, num_warps, constexprs)

    def _launch_bound(
        self, launch: Callable[..., Any], prefix: tuple, device: int, grid: tuple, args: tuple, num_warps: int,
        constexprs: tuple,
    ) -> None:
        """Call a bound launcher; if it rejects its very first call, fall back to Triton's path for good."""
        try:
            if len(grid) == 1:
                launch(grid[0], 1, 1, _raw_stream(device), *prefix, *args, *constexprs)
            else:
                launch(*grid, *(1,) * (3 - len(grid)), _raw_stream(device), *prefix, *args, *constexprs)
        except (TypeError, ValueError):
            if self._verified:
                raise
            self._reject_direct_launches()
            self._launch(grid, args, num_warps, constexprs)
            return
        if not self._verified:
            self._verified = True

    def _reject_direct_launches(self) -> None:
        """The compiled launcher rejected its first call before launching: this Triton's launcher
        takes other arguments. Triton's own path serves this kernel from now on."""
        self._fast = False
        self._forget_bindings()

    def _forget_bindings(self) -> None:
        self._compiled.clear()
        self._planned.clear()

    def _remember_plan(self, device: int, plan: Any, args: tuple, num_warps: int, constexprs: tuple) -> None:
        """Bind ``plan`` to the compiled variant the call just used, when all its pointers were
        aligned; later calls check the alignment of every tensor argument but the fresh outputs."""
        pointers = []
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                if a.data_ptr() & 15:
                    return
                if i not in self._fresh:
                    pointers.append(i)
        bound = self._compiled.get((device, constexprs, num_warps, _spec_key(args)))
        if bound is not None and self._hooks_idle():
            if len(self._planned) >= _MAX_VARIANTS:
                self._planned.clear()
            self._planned[plan] = (device, *bound, tuple(pointers))

    def _hooks_idle(self) -> bool:
        """Nothing Triton would call around a launch: no pre-run hooks, no launch hooks (None in
        Triton 3.6, an empty chain later; anything else counts as a hook). Written out: this
        runs on every launch."""
        if getattr(self.kernel, "pre_run_hooks", None):
            return False
        runtime = self._runtime_knobs
        if runtime is None:
            from triton import knobs

            runtime = self._runtime_knobs = knobs.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        return (enter is None or not getattr(enter, "calls", True)) and (
            leave is None or not getattr(leave, "calls", True)
        )

    def _noted_launch(self, device: int, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> Any:
        """``_launch``; the first launch of a variant on a device is its compile: timed and logged."""
        variant = (device, constexprs, num_warps)
        if variant in self._launched:
            return self._launch(grid, args, num_warps, constexprs)
        start = time.perf_counter()
        compiled = self._launch(grid, args, num_warps, constexprs)
        if len(self._launched) >= _MAX_VARIANTS:
            self._launched.clear()
        self._launched.add(variant)
        if logs.compile_logging():
            seconds = time.perf_counter() - start
            detail = ", ".join(f"{k}={v}" for k, v in zip(self.constexprs, constexprs, strict=True))
            detail += f", num_warps={num_warps}" + (", interpreted" if _INTERPRET else "")
            logs.kernel_compiled("triton", self.op, dispatch_key(), seconds, self.name, detail=detail)
        return compiled

    def _launch(self, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> Any:
        """Triton's own launch path; returns what it returns (the compiled kernel on GPU)."""
        return self.kernel[grid](*args, num_warps=num_warps, **dict(zip(self.constexprs, constexprs, strict=True)))


def _declared_params(kernel: Any) -> list[tuple[str, bool]] | None:
    """``(name, is_constexpr)`` per parameter of a ``@triton.jit`` kernel (also an interpreted one,
    which keeps only its Python function), or None when they cannot be told."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return [(p.name, bool(p.is_constexpr)) for p in params]
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return None
    import inspect

    return [
        (name, p.annotation is tl.constexpr or str(p.annotation).endswith("constexpr"))
        for name, p in inspect.signature(fn).parameters.items()
    ]


def _cuda_device_of(args: tuple) -> int:
    """Index of the CUDA device of the first argument (-1 when it is not a CUDA tensor)."""
    first = args[0]
    if first.__class__ is _Tensor or isinstance(first, _Tensor):
        return first.get_device()  # -1 for CPU tensors
    return -1


# Triton versions whose CUDA launcher object is known field by field: for them a launch calls the
# compiled C launcher directly, skipping the Python ``__call__`` that only allocates scratch
# buffers (none for these kernels). Other versions go through ``compiled.run``.
_DIRECT_LAUNCH_VERSIONS = ("3.6.",)


def _bind(compiled: Any) -> tuple[Callable[..., Any], tuple]:
    """``(launch, prefix)`` for a compiled kernel: a launch is
    ``launch(grid_x, grid_y, grid_z, stream, *prefix, *args, *constexprs)``."""
    run = compiled.run
    hooks = (compiled.packed_metadata, None, None, None)  # launch metadata, enter hook, exit hook: none
    if (
        triton.__version__.startswith(_DIRECT_LAUNCH_VERSIONS)
        and callable(getattr(run, "launch", None))
        and getattr(run, "global_scratch_size", None) == 0
        and getattr(run, "profile_scratch_size", None) == 0
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
    ):
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None, *hooks)
    return run, (compiled.function, *hooks)


def _compiled_usable(compiled: Any) -> bool:
    """A compiled kernel, loaded by its first launch, whose launcher the fast path knows how to
    call (Triton 3.6 and later: ``run``, ``function``, ``packed_metadata``; not a pending future)."""
    return (
        compiled is not None
        and not hasattr(compiled, "result")
        and getattr(compiled, "function", None) is not None
        and hasattr(compiled, "packed_metadata")
        and callable(getattr(compiled, "run", None))
    )
