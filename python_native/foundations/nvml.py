"""The machine's GPUs, read through NVML without initialising CUDA.

Registration happens during ``import torch``, where initialising CUDA is not allowed (it would
break forked workers and cost seconds). NVML, the driver's management library, answers which GPU
models are installed, and what each has (SMs, memory bandwidth, clocks), in milliseconds and
without a CUDA context: enough to pick the calibration table or scale the portable policy that
applies before any override is installed.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

_NAME_LENGTH = 96
_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t

# FP32 cores per SM by compute capability (what NVML's core count is divided by): 64 on Volta,
# Turing and the A100, 128 on consumer Ampere, Ada, Hopper and Blackwell.
_CORES_PER_SM = {(7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64}


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML describes it; a figure NVML cannot give is None."""

    name: str
    major: int
    minor: int
    sm_count: int | None = None
    memory_bus_width_bits: int | None = None
    memory_clock_mhz: int | None = None
    sm_clock_mhz: int | None = None

    @property
    def key(self) -> str:
        """``"<name>/sm<major><minor>"``, as ``calibration.device_key`` names a CUDA device."""
        return f"{self.name}/sm{self.major}{self.minor}"

    @property
    def memory_bandwidth_gbps(self) -> float | None:
        """Peak memory bandwidth: bus width x memory clock x 2 (double data rate), in GB/s."""
        if not self.memory_bus_width_bits or not self.memory_clock_mhz:
            return None
        return self.memory_bus_width_bits / 8 * self.memory_clock_mhz * 2 / 1000

    def properties(self) -> dict[str, float]:
        """What the portable calibration policy scales by: ``sm_count``, ``memory_bandwidth_gbps``
        and ``sm_clock_mhz``, each only where known."""
        found = {"sm_count": self.sm_count, "memory_bandwidth_gbps": self.memory_bandwidth_gbps,
                 "sm_clock_mhz": self.sm_clock_mhz}
        return {k: v for k, v in found.items() if v}


def _optional_uint(fn, *args) -> int | None:
    """An NVML query answering one unsigned int, or None where the driver lacks it or refuses."""
    value = ctypes.c_uint()
    try:
        return value.value if fn(*args, ctypes.byref(value)) == 0 and value.value > 0 else None
    except (AttributeError, TypeError, ctypes.ArgumentError):
        return None


def _describe(lib, handle, name: str, major: int, minor: int) -> Gpu:
    cores = _optional_uint(getattr(lib, "nvmlDeviceGetNumGpuCores", None), handle)
    per_sm = _CORES_PER_SM.get((major, minor), 128)
    return Gpu(
        name=name, major=major, minor=minor,
        sm_count=cores // per_sm if cores and cores % per_sm == 0 else None,
        memory_bus_width_bits=_optional_uint(getattr(lib, "nvmlDeviceGetMemoryBusWidth", None), handle),
        memory_clock_mhz=_optional_uint(getattr(lib, "nvmlDeviceGetMaxClockInfo", None), handle, _CLOCK_MEM),
        sm_clock_mhz=_optional_uint(getattr(lib, "nvmlDeviceGetMaxClockInfo", None), handle, _CLOCK_SM),
    )


@functools.cache
def devices() -> tuple[Gpu, ...] | None:
    """Every GPU NVML lists, in its order, or None where NVML is unavailable.

    ``CUDA_VISIBLE_DEVICES`` is not applied: callers use the models and what each has, which the
    hidden GPUs of a machine share in practice.
    """
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if lib.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        found = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            name = ctypes.create_string_buffer(_NAME_LENGTH)
            major, minor = ctypes.c_int(), ctypes.c_int()
            if (
                lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0
                or lib.nvmlDeviceGetName(handle, name, _NAME_LENGTH) != 0
                or lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0
            ):
                return None
            found.append(_describe(lib, handle, name.value.decode(errors="replace"), major.value, minor.value))
        return tuple(found)
    except AttributeError:  # a driver library without these entry points
        return None
    finally:
        lib.nvmlShutdown()


def device_keys() -> frozenset[str] | None:
    """``"<name>/sm<major><minor>"`` of every GPU NVML lists, or None where NVML is unavailable.

    Keys match ``calibration.device_key`` (NVML and CUDA report the same product name).
    """
    found = devices()
    return None if found is None else frozenset(gpu.key for gpu in found)


def properties(key: str) -> dict[str, float] | None:
    """What NVML says the GPU model ``key`` has (see ``Gpu.properties``), or None where it lists none."""
    found = devices()
    gpu = next((g for g in found or () if g.key == key), None)
    return None if gpu is None else gpu.properties()


def cache_clear() -> None:
    """Ask NVML again on next use (tests fake its answers)."""
    devices.cache_clear()
