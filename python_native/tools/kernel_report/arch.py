"""What a GPU architecture offers a kernel: the per-SM limits occupancy follows from, and the
reference GPU whose SM count and bandwidth the report plans launches and predicts times for.

Per-SM limits are those of NVIDIA's CUDA C++ Programming Guide, table "Technical Specifications
per Compute Capability" (registers per SM, resident warps and blocks per SM, shared memory per
SM), with the register allocation unit (256 registers per warp) and the 1 KB of shared memory the
driver reserves per block from the CUDA Occupancy Calculator. SM counts and memory bandwidths are
those of the named parts' datasheets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """One compile target and the GPU the report assumes for it."""

    name: str  # the compiler's target, e.g. sm_90a
    capability: int  # Triton's GPUTarget arch, e.g. 90
    gpu: str  # the reference part
    sm_count: int
    bandwidth_gbps: float  # the part's DRAM bandwidth (datasheet)
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    reg_unit: int = 256  # registers are allocated per warp in units of this many
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 228 * 1024
    smem_reserved_per_block: int = 1024
    max_threads_per_block: int = 1024


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("sm_80", 80, "A100 SXM4 80GB", 108, 2039.0, smem_per_sm=164 * 1024),
        Arch("sm_90a", 90, "H100 SXM5 80GB", 132, 3352.0),
        Arch("sm_100a", 100, "B200", 148, 8000.0),
    )
}
DEFAULT_ARCH = "sm_90a"


def arch(name: str) -> Arch:
    """The table entry for ``name``, or a ValueError naming the ones known."""
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; expected one of {', '.join(ARCHS)}") from None


@dataclass(frozen=True)
class Occupancy:
    """How many programs (CTAs) of a kernel an SM holds at once, and what limits them."""

    blocks_per_sm: int
    resident_warps: int  # warps per SM when every slot is filled
    occupancy: float  # resident warps / the SM's maximum
    limit: str  # registers | warps | shared memory | blocks | none fit


def occupancy(a: Arch, regs: int, warps: int, shared: int) -> Occupancy:
    """Blocks per SM for ``warps`` warps of ``regs`` registers per thread and ``shared`` bytes of
    shared memory per block, as the occupancy calculator counts them."""
    regs_per_warp = math.ceil(max(regs, 1) * 32 / a.reg_unit) * a.reg_unit
    limits = {
        "registers": (a.regs_per_sm // regs_per_warp) // warps,
        "warps": a.max_warps_per_sm // warps,
        "shared memory": a.smem_per_sm // (shared + a.smem_reserved_per_block),
        "blocks": a.max_blocks_per_sm,
    }
    limit = min(limits, key=limits.__getitem__)
    blocks = limits[limit]
    if warps * 32 > a.max_threads_per_block or blocks == 0:
        return Occupancy(0, 0, 0.0, "none fit")
    return Occupancy(blocks, blocks * warps, blocks * warps / a.max_warps_per_sm, limit)


@dataclass(frozen=True)
class Waves:
    """A grid of ``programs`` against the GPU's resident slots (``blocks_per_sm`` x SMs)."""

    programs: int
    slots: int
    waves: float  # programs / slots
    tail: float  # fill of the last wave (1.0: full)
    warps_per_sm: float  # warps an SM holds on average while the grid runs (at most the resident warps)


def waves(a: Arch, programs: int, occ: Occupancy, warps: int) -> Waves:
    slots = occ.blocks_per_sm * a.sm_count
    if slots == 0:
        return Waves(programs, 0, math.inf, 0.0, 0.0)
    full, rest = divmod(programs, slots)
    tail = rest / slots if rest else 1.0
    per_sm = min(occ.blocks_per_sm, programs / a.sm_count) * warps
    return Waves(programs, slots, programs / slots, tail, per_sm)
