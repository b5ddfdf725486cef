"""The machine's GPU models, read through NVML without initialising CUDA.

Registration happens during ``import torch``, where initialising CUDA is not allowed (it would
break forked workers and cost seconds). NVML, the driver's management library, answers which GPU
models are installed in milliseconds and without a CUDA context: enough to pick the calibration
table that applies before any override is installed.
"""

from __future__ import annotations

import ctypes
import functools

_NAME_LENGTH = 96


@functools.cache
def device_keys() -> frozenset[str] | None:
    """``"<name>/sm<major><minor>"`` of every GPU NVML lists, or None where NVML is unavailable.

    Keys match ``calibration.device_key`` (NVML and CUDA report the same product name).
    ``CUDA_VISIBLE_DEVICES`` is not applied: callers use the answer only when every GPU is the
    same model, where it does not matter.
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
        keys = set()
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
            keys.add(f"{name.value.decode(errors='replace')}/sm{major.value}{minor.value}")
        return frozenset(keys)
    except AttributeError:  # a driver library without these entry points
        return None
    finally:
        lib.nvmlShutdown()
