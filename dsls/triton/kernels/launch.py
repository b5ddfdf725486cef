"""The launcher every kernel goes through, and what the kernels share besides (a rounding cast).

``Launcher`` replaces ``kernel[grid](...)`` on the hot path. Triton's ``JITFunction.run`` binds and
specializes every argument on every call; after the first launch of a specialization the launcher keeps
the compiled kernel under a cheap key (constexprs, warps, and per argument what Triton specializes
on: dtype and 16-byte alignment of pointers, ``== 1`` / divisibility by 16 / width of ints) and
calls its low-level launcher directly, the way ``JITFunction.run`` itself does. Anything unusual
(the interpreter, launch hooks, pre-run hooks, a Triton whose compiled kernels lack the expected
members, a tensor on a device other than the current one) takes the normal path. Under the
interpreter, which is not thread-safe, launches are serialized.

What the launch path reads that a simulation or a stub changes lives in one object, ``STATE``,
changed in place (the stubs and the simulated device of ``python_native_dsls.triton.testing``
change it). While a thread records
for replay (``python_native.foundations.launches``), its launches go through Triton's own path and
each is described for the compiled front (``launch_record``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from python_native.foundations import launches, logs

from ..target import dispatch_key, interpret_mode
from .compiled_kernels import bind, compiled_usable, declared_params, describe

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
LaunchFn = Callable[["Launcher", tuple, tuple, int, tuple], Any]

# Triton's interpreter keeps global state per launch: concurrent launches corrupt each other.
_INTERPRETER_LOCK = threading.Lock()
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_Tensor = torch.Tensor
# Compiled specializations kept per kernel; past this many the table starts over (Triton keeps its own).
_MAX_SPECIALIZATIONS = 256
_RECORDERS = launches.RECORDERS


class LaunchState:
    """What every launch reads that stubs and simulations change (``python_native_dsls.triton.testing``),
    in one object.

    ``stub`` replaces the final launch (benchmarks measure everything up to it; set it through
    ``set_stub``); ``launch`` replaces Triton's compile-and-launch (``Launcher._launch``);
    ``not_cuda`` is what a tensor's ``get_device()`` answers when it is not on a CUDA device (a
    simulation moves it, so that CPU tensors count as on the current device). ``quiet``: no stub is
    set and no thread records, the one thing a planned launch reads before its fast path.
    """

    __slots__ = ("interpret", "not_cuda", "current_device", "raw_stream", "stub", "launch", "launchers", "quiet")

    def __init__(self) -> None:
        self.interpret = interpret_mode()
        self.not_cuda = -1
        self.current_device: Callable[[], int] = (
            getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
        )
        self.raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda index: torch.cuda.current_stream(index).cuda_stream
        )
        self.stub: LaunchStub | None = None
        self.quiet = True
        self.launch: LaunchFn | None = None
        self.launchers: weakref.WeakSet[Launcher] = weakref.WeakSet()  # every launcher, for simulations

    def set_stub(self, stub: LaunchStub | None) -> None:
        self.stub = stub
        self.update_quiet()

    def update_quiet(self) -> None:
        """``quiet`` again, after a stub or a thread's recording came or went."""
        self.quiet = self.stub is None and not _RECORDERS.threads


STATE = LaunchState()
launches.on_recording_change(STATE.update_quiet)


def spec_key(args: tuple) -> tuple:
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


class Launcher:
    """One ``@triton.jit`` kernel with its constexpr parameter names (the trailing parameters).

    Call it as ``launcher(grid, args, num_warps, *constexpr_values)``: ``args`` are the runtime
    arguments in declaration order, the first of them a tensor on the launch device; the
    constexpr values follow in ``constexprs`` order. ``fresh`` names the pointer parameters every
    caller passes a tensor it has just allocated (an output): the allocator aligns those, so a
    planned launch does not check their alignment again. ``op`` names the op(s) the kernel serves,
    for compile events (``TORCH_LOGS=python_native_compile``): the first launch of each specialization
    (constexprs and warps, per device) is its compile, timed and logged.
    """

    def __init__(self, kernel: Any, constexprs: Sequence[str], fresh: Sequence[str] = (), op: str | None = None) -> None:
        self.kernel = kernel
        self.constexprs = tuple(constexprs)
        self._params = declared_params(kernel)
        names = [name for name, _ in self._params or ()]
        unknown = [name for name in fresh if name not in names]
        if unknown:
            raise ValueError(f"fresh={list(fresh)!r}: {unknown} are not parameters of the kernel ({names})")
        self._fresh = frozenset(names.index(name) for name in fresh)
        self.name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "kernel")
        self.op = op or self.name
        self._launched: set[tuple] = set()  # specializations launched once (compiled), for compile events
        self._compiled: dict[tuple, Any] = {}
        # plan -> (device, launch, prefix, positions of the tensors whose alignment each call checks)
        self._planned: dict[Any, tuple] = {}
        self._fast = not STATE.interpret and self._layout_ok()
        self._runtime_knobs: Any = None  # triton.knobs.runtime, read once the fast path first runs
        self._verified = False  # a direct launch has succeeded: its errors are real ones
        STATE.launchers.add(self)

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
        if not STATE.quiet and self._intercepted(grid, args, num_warps, constexprs):
            return
        self._dispatch(grid, args, num_warps, constexprs)

    def _dispatch(self, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> None:
        """A launch with nothing intercepting it: the interpreter, Triton's path, or the bound launcher."""
        state = STATE
        if state.interpret:
            with _INTERPRETER_LOCK:
                self._noted_launch(-1, grid, args, num_warps, constexprs)
            return
        device = _cuda_device_of(args)
        if device == state.not_cuda:  # not a CUDA tensor: Triton's own path reports it
            self._launch(grid, args, num_warps, constexprs)
            return
        if device != state.current_device():
            # Triton launches on the current device; switch only when the tensor is elsewhere.
            with torch.cuda.device(device):
                self._noted_launch(device, grid, args, num_warps, constexprs)
            return
        if not self._fast:
            self._noted_launch(device, grid, args, num_warps, constexprs)
            return
        key = (device, constexprs, num_warps, spec_key(args))
        bound = self._compiled.get(key)
        if bound is not None and self._hooks_idle():
            self._launch_bound(bound[0], bound[1], device, grid, args, num_warps, constexprs)
            return
        compiled = self._noted_launch(device, grid, args, num_warps, constexprs)
        if compiled_usable(compiled):
            if len(self._compiled) >= _MAX_SPECIALIZATIONS:
                self._compiled.clear()
            self._compiled[key] = bind(compiled)

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
        state = STATE
        if entry is not None and state.quiet:
            device, launch, prefix, pointers = entry
            if args[0].get_device() == device and state.current_device() == device and self._hooks_idle():
                for i in pointers:
                    if args[i].data_ptr() & 15:
                        break
                else:
                    if len(grid) == 1 and self._verified:  # the common case, without a frame of its own
                        launch(grid[0], 1, 1, state.raw_stream(device), *prefix, *args, *constexprs)
                    else:
                        self._launch_bound(launch, prefix, device, grid, args, num_warps, constexprs)
                    return
        self._planned_slow(plan, grid, args, num_warps, constexprs)

    def _planned_slow(self, plan: Any, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> None:
        """A planned call off the fast path: stubbed, recorded, interpreted, first of its plan, or unusual."""
        state = STATE
        if not state.quiet and self._intercepted(grid, args, num_warps, constexprs):
            return
        self._dispatch(grid, args, num_warps, constexprs)
        if not state.interpret and self._fast:
            device = _cuda_device_of(args)
            if device != state.not_cuda and device == state.current_device():
                self._remember_plan(device, plan, args, num_warps, constexprs)

    def _launch_bound(
        self, launch: Callable[..., Any], prefix: tuple, device: int, grid: tuple, args: tuple, num_warps: int,
        constexprs: tuple,
    ) -> None:
        """Call a bound launcher; if it rejects its very first call, fall back to Triton's path for good."""
        try:
            stream = STATE.raw_stream(device)
            if len(grid) == 1:
                launch(grid[0], 1, 1, stream, *prefix, *args, *constexprs)
            else:
                launch(*grid, *(1,) * (3 - len(grid)), stream, *prefix, *args, *constexprs)
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
        """Bind ``plan`` to the compiled specialization the call just used, when all its pointers were
        aligned; later calls check the alignment of every tensor argument but the fresh outputs."""
        pointers = []
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                if a.data_ptr() & 15:
                    return
                if i not in self._fresh:
                    pointers.append(i)
        bound = self._compiled.get((device, constexprs, num_warps, spec_key(args)))
        if bound is not None and self._hooks_idle():
            if len(self._planned) >= _MAX_SPECIALIZATIONS:
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
        """``_launch``; the first launch of a specialization on a device is its compile: timed and logged."""
        specialization = (device, constexprs, num_warps)
        if specialization in self._launched:
            return self._launch(grid, args, num_warps, constexprs)
        start = time.perf_counter()
        compiled = self._launch(grid, args, num_warps, constexprs)
        if len(self._launched) >= _MAX_SPECIALIZATIONS:
            self._launched.clear()
        self._launched.add(specialization)
        if logs.compile_logging():
            seconds = time.perf_counter() - start
            detail = ", ".join(f"{k}={v}" for k, v in zip(self.constexprs, constexprs, strict=True))
            detail += f", num_warps={num_warps}" + (", interpreted" if STATE.interpret else "")
            logs.kernel_compiled("triton", self.op, dispatch_key(), seconds, self.name, detail=detail)
        return compiled

    def _launch(self, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> Any:
        """Triton's own launch path (or a simulation's stand-in for it); returns what it returns
        (the compiled kernel on GPU)."""
        replacement = STATE.launch
        if replacement is not None:
            return replacement(self, grid, args, num_warps, constexprs)
        return self.kernel[grid](*args, num_warps=num_warps, **dict(zip(self.constexprs, constexprs, strict=True)))

    # ----- stubs and recordings -----

    def _intercepted(self, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> bool:
        """Hand the launch to the stub, or launch and record it where this thread records; False
        when neither applies (another thread records: this launch goes its usual way)."""
        stub = STATE.stub
        if stub is not None:
            stub(self, grid, args, num_warps, constexprs)
            return True
        recording = launches.current()
        if recording is None:
            return False
        self._recorded(recording, grid, args, num_warps, constexprs)
        return True

    def _recorded(self, recording: launches.Recording, grid: tuple, args: tuple, num_warps: int,
                  constexprs: tuple) -> None:
        """Launch through Triton's own path (which hands back the compiled kernel) and describe it."""
        state = STATE
        device = _cuda_device_of(args)
        why = ("through the interpreter" if state.interpret else "off the GPU" if device == state.not_cuda
               else "with launch hooks installed" if not self._hooks_idle()
               else "" if self._layout_ok() else "with constexprs not declared last")
        if why:
            recording.refuse(f"{self.name} launched {why}")
            self._dispatch(grid, args, num_warps, constexprs)
            return
        if device != state.current_device():
            with torch.cuda.device(device):
                compiled = self._noted_launch(device, grid, args, num_warps, constexprs)
        else:
            compiled = self._noted_launch(device, grid, args, num_warps, constexprs)
        found = describe(compiled, grid, (*args, *constexprs))
        if isinstance(found, str):
            recording.refuse(f"{self.name}: {found}")
        else:
            recording.add(found, keep=compiled)


def _cuda_device_of(args: tuple) -> int:
    """Index of the CUDA device of the first argument (-1 when it is not a CUDA tensor)."""
    first = args[0]
    if first.__class__ is _Tensor or isinstance(first, _Tensor):
        return first.get_device()  # -1 for CPU tensors
    return -1
