"""From figures to a prediction: occupancy, waves, bytes against the op's minimum, and time.

The time model of a memory-bound launch (stated so that a GPU run can check it):

- DRAM moves bytes at the copy bandwidth, ``COPY_EFFICIENCY`` of the datasheet's (a device to
  device copy reached 3.0 of the H100 SXM's 3.35 TB/s);
- an SM keeps its share of that bandwidth busy only with enough loads in flight: the share it gets
  is ``min(1, warps on the SM / WARPS_FOR_BANDWIDTH)``;
- programs run in waves of ``blocks per SM x SMs``; the last, partial wave has fewer warps per SM;
- each launch costs ``LAUNCH_US`` on top (the gap between back-to-back kernels and their ramp).

``WARPS_FOR_BANDWIDTH`` is Little's law for an H100 SXM: 3.35 TB/s x ~0.8 us of loaded DRAM latency
/ 132 SMs is ~20 KB to keep in flight per SM. The row kernels here issue two 16-byte loads per
thread per tensor per step and spend part of each step in reductions, so a warp keeps about
1 KB in flight on average: 32 resident warps (half of sm_90's 64) are needed to reach the copy
bandwidth, and the test asks every launch that moves a real share of its call's bytes for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from python_native.tools.kernel_report.arch import Arch, occupancy

COPY_EFFICIENCY = 0.9
WARPS_FOR_BANDWIDTH = 32
LAUNCH_US = 1.5


@dataclass(frozen=True)
class Timing:
    microseconds: float
    bandwidth_share: float  # of the copy bandwidth over the launch's duration, launch cost excluded


def launch_time(a: Arch, total_bytes: float, programs: int, regs: int, warps: int, shared: int) -> Timing:
    """Predicted duration of one launch moving ``total_bytes`` in ``programs`` programs."""
    occ = occupancy(a, regs, warps, shared)
    if occ.blocks_per_sm == 0 or programs == 0:
        return Timing(float("inf"), 0.0)
    bandwidth = a.bandwidth_gbps * 1e3 * COPY_EFFICIENCY  # bytes per microsecond
    slots = occ.blocks_per_sm * a.sm_count
    per_program = total_bytes / programs
    full, rest = divmod(programs, slots)

    def share(warps_per_sm: float) -> float:
        return min(1.0, warps_per_sm / WARPS_FOR_BANDWIDTH)

    busy = 0.0
    if full:
        busy += full * slots * per_program / (bandwidth * share(occ.resident_warps))
    if rest >= a.sm_count:  # a partial wave over every SM
        busy += rest * per_program / (bandwidth * share(rest / a.sm_count * warps))
    elif rest:  # fewer programs than SMs: the idle SMs' share is lost
        busy += rest * per_program / (bandwidth * rest / a.sm_count * share(warps))
    ideal = total_bytes / bandwidth
    return Timing(busy + LAUNCH_US, ideal / busy if busy else 0.0)
