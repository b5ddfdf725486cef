"""The launcher's stand-ins for tests and benchmarks: stubbed launches and a simulated device.

Both change the launcher's one state object (``launch.STATE``) for the length of a ``with``
block and put it back after; neither rebinds a module global.
"""

from __future__ import annotations

import contextlib
import types
import zlib
from collections.abc import Iterator
from typing import Any

from .kernels.launch import STATE, Launcher, LaunchStub, spec_key


@contextlib.contextmanager
def stubbed_launches(stub: LaunchStub | None = None) -> Iterator[list[str]]:
    """Replace every kernel launch with ``stub`` (default: record the kernel name and return).

    Everything before the launch still runs: routing, conds, plans, output allocation, argument
    preparation. Yields the list of recorded kernel names (default stub only).
    """
    names: list[str] = []

    def record(launcher: Launcher, grid: tuple, args: tuple, num_warps: int, constexprs: Any) -> None:
        names.append(launcher.name)

    previous = STATE.stub
    STATE.set_stub(stub or record)
    try:
        yield names
    finally:
        STATE.set_stub(previous)


class _StandInRun:
    """The compiled kernel's launcher, as the launch path reads it: it records the kernel's name."""

    launch_cooperative_grid = False
    launch_pdl = False
    global_scratch_size = 0
    profile_scratch_size = 0

    def __init__(self, name: str, names: list[str]) -> None:
        self.name, self.names = name, names

    def __call__(self, *args: Any) -> None:
        self.names.append(self.name)


def function_id(name: str) -> int:
    """The stand-in's handle for a kernel: stable per name, never 0."""
    return zlib.crc32(name.encode()) | (1 << 32)


def _signature(launcher: Launcher, args: tuple, constexprs: tuple) -> dict[str, str]:
    """What Triton would specialize the launch's parameters as (its own rule, ``mangle_type``)."""
    from triton.runtime.jit import mangle_type

    values = (*args, *constexprs)
    return {name: "constexpr" if is_constexpr else mangle_type(value, True)
            for (name, is_constexpr), value in zip(launcher._params or (), values, strict=True)}


@contextlib.contextmanager
def simulated_device() -> Iterator[list[str]]:
    """Run the GPU launch path on CPU tensors, Triton's compile and launch replaced by a no-op.

    CPU tensors count as on the current device; a first launch returns a stand-in compiled kernel
    (a handle, its warps, and the signature Triton would specialize) whose launcher records the
    kernel's name and returns. Everything else a GPU call does in Python runs as on a GPU: plans,
    allocations, launch keys, device, hook and alignment checks, the bound launcher's call, and
    recording for replay. Benchmarks time the host path of a hit with it on machines without a
    GPU. Launchers forget what they bound on entry and on exit. Yields the recorded kernel names.
    """
    names: list[str] = []
    compiled_for: dict[tuple, Any] = {}

    def fake_launch(launcher: Launcher, grid: tuple, args: tuple, num_warps: int, constexprs: tuple) -> Any:
        key = (launcher.name, constexprs, num_warps, spec_key(args))
        compiled = compiled_for.get(key)
        if compiled is None:
            compiled = compiled_for[key] = types.SimpleNamespace(
                function=function_id(launcher.name), packed_metadata=(num_warps, 1, 0),
                src=types.SimpleNamespace(signature=_signature(launcher, args, constexprs)),
                run=_StandInRun(launcher.name, names),
            )
        names.append(launcher.name)
        return compiled

    fields = ("interpret", "not_cuda", "current_device", "raw_stream", "launch")
    saved = {name: getattr(STATE, name) for name in fields}
    launchers = list(STATE.launchers)
    fast = {launcher: launcher._fast for launcher in launchers}
    STATE.interpret, STATE.not_cuda, STATE.launch = False, -2, fake_launch
    STATE.current_device, STATE.raw_stream = (lambda: -1), (lambda index: 0)
    for launcher in launchers:
        launcher._forget_bindings()
        launcher._fast = launcher._layout_ok()
    try:
        yield names
    finally:
        for name, value in saved.items():
            setattr(STATE, name, value)
        for launcher in list(STATE.launchers):  # those made inside too (a kernel module imported meanwhile)
            launcher._forget_bindings()
            launcher._fast = fast.get(launcher, not STATE.interpret and launcher._layout_ok())
