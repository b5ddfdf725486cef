"""The launches an override makes for a call, taken from its own cond and impl.

Each recorded call is replayed on CPU stand-ins of its arguments (``calls.materialize``): the
override's cond plans it, its impl runs with every kernel launch stubbed (``testing.stubbed_launches``)
and persistent grids planned for the target's SM count (``tuning.planning_for``). What the stub
receives (kernel, grid, arguments, warps, constexprs) is what a GPU run launches, so the report
follows the plans and tiles of the ops as they change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from python_native.tools.kernel_report.calls import Call, materialize


@dataclass
class Launch:
    """One kernel launch as the impl made it."""

    kernel: Any  # the @triton.jit function (the interpreter's under the interpreter)
    name: str
    grid: tuple[int, ...]
    args: tuple
    num_warps: int
    constexprs: dict[str, Any]

    @property
    def programs(self) -> int:
        total = 1
        for g in self.grid:
            total *= g
        return total


@dataclass
class RecordedCall:
    """A call with its stand-in arguments, the override's outputs and the launches it made."""

    family: str
    call: Call  # arguments are the CPU stand-ins
    outputs: list[torch.Tensor] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    declined: bool = False

    def inputs(self) -> list[torch.Tensor]:
        return _tensors((self.call.args, self.call.kwargs))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def record_call(call: Call, family: str, spec: Any, sm_count: int) -> RecordedCall:
    """Run ``spec``'s cond and impl on stand-ins of ``call``, recording the launches."""
    from python_native_dsls.triton import testing
    from python_native_dsls.triton.kernels import tuning

    args, kwargs = materialize(call.args), materialize(call.kwargs)
    recorded = RecordedCall(family, Call(call.op, args, kwargs))

    def record(launcher: Any, grid: tuple, largs: tuple, num_warps: int, constexprs: tuple) -> None:
        recorded.launches.append(Launch(
            launcher.kernel, launcher.name, tuple(int(g) for g in grid), tuple(largs), int(num_warps),
            dict(zip(launcher.constexprs, constexprs, strict=True)),
        ))

    with tuning.planning_for(sm_count):
        plan = spec.cond(*args, **kwargs)
        if plan is None or plan is False:
            recorded.declined = True
            return recorded
        with testing.stubbed_launches(record):
            if spec.options.get("impl_takes_plan"):
                out = spec.impl(*args, **kwargs, plan=plan)
            else:
                out = spec.impl(*args, **kwargs)
    recorded.outputs = _tensors(out)
    return recorded
