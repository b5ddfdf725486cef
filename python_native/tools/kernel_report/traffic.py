"""Global-memory bytes a launch moves, counted by running some of its programs in Triton's interpreter.

The launch is the real one (full-size arguments, the plan's grid); only a few programs run: per
grid axis the first, the second (standing for every interior program) and the last (the tail),
with the launch's grid dims in force so ``program_id`` / ``num_programs`` read as on the GPU. The
interpreter's masked loads and stores (atomics too) are hooked: each active lane counts its
element's bytes, attributed to the argument tensor its address falls in.

Counting rules (the traffic model):

- A program's own reads and writes count in full, re-reads included: a second pass over a row
  is a second trip to DRAM (a streaming program's working set outlives its share of L2).
- An argument every sampled program reads at exactly the same addresses (a weight, a bias, a
  small table) is a broadcast: served from L2 after its first read, it counts once per launch.
- Interior programs are taken to move what the second program moves; the estimate is
  ``sum(weight x bytes)`` over the sampled programs, the weight being how many programs each stands for.

Only the addresses the sampled programs touch are ever mapped: stand-in tensors are allocated
uninitialized, so a launch over gigabytes costs the pages of a few rows.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from python_native.tools.kernel_report.launches import Launch


@dataclass
class Region:
    """The memory one or more launch arguments cover (aliases share one region)."""

    start: int
    end: int
    names: list[str]
    tensor: torch.Tensor


@dataclass
class Traffic:
    """Bytes a launch moves, per region (keyed by the region's start address)."""

    read: dict[int, float] = field(default_factory=dict)
    written: dict[int, float] = field(default_factory=dict)
    broadcast: set[int] = field(default_factory=set)
    regions: dict[int, Region] = field(default_factory=dict)
    sampled: int = 0

    @property
    def total(self) -> float:
        return sum(self.read.values()) + sum(self.written.values())


def _span(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True) if s > 0) + 1) * t.element_size()


def regions_of(launch: Launch) -> list[Region]:
    names = list(_param_names(launch.kernel))
    regions: dict[tuple[int, int], Region] = {}
    for i, a in enumerate(launch.args):
        if isinstance(a, torch.Tensor) and a.numel():
            key = (a.data_ptr(), a.data_ptr() + _span(a))
            name = names[i] if i < len(names) else f"arg{i}"
            if key in regions:
                regions[key].names.append(name)
            else:
                regions[key] = Region(key[0], key[1], [name], a)
    return sorted(regions.values(), key=lambda r: r.start)


def _param_names(kernel: Any) -> list[str]:
    import inspect

    fn = getattr(kernel, "fn", kernel)
    return list(inspect.signature(fn).parameters)


def _samples(extent: int) -> list[tuple[int, int]]:
    """``(index, programs it stands for)`` along one grid axis: the first stands for every program
    but the last, which may be a partial one."""
    return [(0, 1)] if extent == 1 else [(0, extent - 1), (extent - 1, 1)]


class _Counter:
    """Per sampled program: bytes and addresses read, bytes written, per region."""

    def __init__(self, regions: list[Region]) -> None:
        self.regions = regions
        self.starts = np.array([r.start for r in regions], dtype=np.uint64)
        self.ends = np.array([r.end for r in regions], dtype=np.uint64)
        self.read: dict[int, int] = defaultdict(int)
        self.written: dict[int, int] = defaultdict(int)
        self.addresses: dict[int, list[np.ndarray]] = defaultdict(list)

    def add(self, ptrs: Any, mask: Any, write: bool) -> None:
        data = np.asarray(ptrs.data)
        active = data[np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)] if mask is not None else data.ravel()
        if active.size == 0:
            return
        width = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        index = np.searchsorted(self.starts, active.astype(np.uint64), side="right") - 1
        inside = (index >= 0) & (active < self.ends[np.clip(index, 0, None)])
        if not inside.all():
            raise RuntimeError(f"a kernel accessed {int((~inside).sum())} addresses outside its tensor arguments")
        for i in np.unique(index):
            hits = active[index == i]
            start = self.regions[i].start
            if write:
                self.written[start] += hits.size * width
            else:
                self.read[start] += hits.size * width
                self.addresses[start].append(hits)


def count(launch: Launch) -> Traffic:
    """Estimate the bytes ``launch`` moves (see the module docstring)."""
    from triton.runtime import interpreter

    from python_native_dsls.triton.kernels import launch as launch_module

    builder = interpreter.interpreter_builder
    regions = regions_of(launch)
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    traffic = Traffic(regions={r.start: r for r in regions})
    per_program: list[tuple[int, _Counter]] = []
    kernel = launch.kernel
    if not hasattr(kernel, "rewrite"):
        raise RuntimeError(f"{launch.name}: traffic is counted under Triton's interpreter (PYTHON_NATIVE_TRITON_INTERPRET=1)")
    with launch_module._INTERPRETER_LOCK:
        saved = {name: builder.__dict__.get(name) for name in _HOOKED}
        try:
            for (x, wx), (y, wy), (z, wz) in itertools.product(*(_samples(g) for g in grid)):
                counter = _Counter(regions)
                _hook(builder, counter, grid, (x, y, z))
                with np.errstate(all="ignore"):
                    kernel[(1,)](*launch.args, num_warps=launch.num_warps, **launch.constexprs)
                per_program.append((wx * wy * wz, counter))
        finally:
            for name, value in saved.items():
                if value is None:
                    builder.__dict__.pop(name, None)
                else:
                    builder.__dict__[name] = value
    traffic.sampled = len(per_program)
    for r in regions:
        shared = _broadcast([c.addresses[r.start] for _, c in per_program])
        if shared is not None:
            traffic.broadcast.add(r.start)
            traffic.read[r.start] = float(shared * r.tensor.element_size())
        else:
            traffic.read[r.start] = float(sum(w * c.read[r.start] for w, c in per_program))
        traffic.written[r.start] = float(sum(w * c.written[r.start] for w, c in per_program))
    return traffic


def _broadcast(reads: list[list[np.ndarray]]) -> int | None:
    """Distinct elements read when every program read the same addresses (two programs or more), else None."""
    if len(reads) < 2 or not all(reads):
        return None
    bounds = {(min(int(a.min()) for a in r), max(int(a.max()) for a in r)) for r in reads}
    if len(bounds) > 1:  # cheap first test: private rows differ in their first or last address
        return None
    sets = [np.unique(np.concatenate(r)) for r in reads]
    return sets[0].size if all(np.array_equal(s, sets[0]) for s in sets[1:]) else None


_HOOKED = ("set_grid_dim", "set_grid_idx", "create_masked_load", "create_masked_store", "create_atomic_rmw",
           "create_atomic_cas")


def _hook(builder: Any, counter: _Counter, grid: tuple[int, int, int], program: tuple[int, int, int]) -> None:
    """Make the one-program launch run ``program`` of ``grid``, counting its memory accesses."""
    cls = type(builder)

    def set_grid_dim(*_):
        cls.set_grid_dim(builder, *grid)

    def set_grid_idx(*_):
        cls.set_grid_idx(builder, *program)

    def load(ptrs, mask, other, *rest):
        counter.add(ptrs, mask, write=False)
        return cls.create_masked_load(builder, ptrs, mask, other, *rest)

    def store(ptrs, value, mask, *rest):
        counter.add(ptrs, mask, write=True)
        return cls.create_masked_store(builder, ptrs, value, mask, *rest)

    def atomic_rmw(op, ptr, val, mask, *rest):
        counter.add(ptr, mask, write=False)
        counter.add(ptr, mask, write=True)
        return cls.create_atomic_rmw(builder, op, ptr, val, mask, *rest)

    def atomic_cas(ptr, cmp, val, *rest):
        counter.add(ptr, None, write=False)
        counter.add(ptr, None, write=True)
        return cls.create_atomic_cas(builder, ptr, cmp, val, *rest)

    builder.set_grid_dim = set_grid_dim
    builder.set_grid_idx = set_grid_idx
    builder.create_masked_load = load
    builder.create_masked_store = store
    builder.create_atomic_rmw = atomic_rmw
    builder.create_atomic_cas = atomic_cas
