"""Shared pieces of the calibration tests: tables, fake GPUs (NVML's answers) and isolated sources."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from python_native.features import calibration
from python_native.features.calibration import sources
from python_native.foundations import dsl_registry, nvml

FAKE_GPU = nvml.Gpu("Fake GPU 80GB", 9, 9)  # as NVML would list it
FAKE_DEVICE = FAKE_GPU.key  # "Fake GPU 80GB/sm99"
H100 = nvml.Gpu("NVIDIA H100 80GB HBM3", 9, 0, sm_count=132, memory_bus_width_bits=5120, memory_clock_mhz=2619)
H200 = nvml.Gpu("NVIDIA H200", 9, 0, sm_count=132, memory_bus_width_bits=6144, memory_clock_mhz=3201)  # 4.9 TB/s
A100 = nvml.Gpu("NVIDIA A100-SXM4-40GB", 8, 0, sm_count=108, memory_bus_width_bits=5120, memory_clock_mhz=1215)
B200 = nvml.Gpu("NVIDIA B200", 10, 0, sm_count=148, memory_bus_width_bits=8192, memory_clock_mhz=3996)  # 8.2 TB/s
H100_PROPS = {"sm_count": 132, "memory_bandwidth_gbps": 3352.3}


def running() -> dict[str, str]:
    """Header fields naming the running torch and Triton versions (a table without version drift)."""
    triton = dsl_registry.version("triton")
    return {"torch": torch.__version__, "triton": str(triton) if triton else "3.9.0",
            "dsls": {"triton": str(triton) if triton else "3.9.0"}}


def table(device: str = FAKE_DEVICE, rows: list | None = None, **header: Any) -> dict:
    """A table for ``device`` (by default measured with the running versions and kernels)."""
    rows = rows if rows is not None else [
        {"op": "_softmax", "dtype": "float32", "bucket": 9, "wins": True},
        {"op": "_softmax", "dtype": "float32", "bucket": 11, "wins": True},
        {"op": "_softmax", "dtype": "float32", "bucket": 11, "wins": False},  # one shape of bucket 11 lost
        {"op": "_softmax", "dtype": "float32", "bucket": 13, "wins": True},
        {"op": "silu", "dtype": "float32", "bucket": 9, "wins": False},
        {"op": "silu", "dtype": "bfloat16", "bucket": 20, "wins": False},
    ]
    kernels = calibration.versions.table_entry({(r.get("dsl", "triton"), r["op"]) for r in rows  # bad ones too
                                                if isinstance(r, dict) and isinstance(r.get("op"), str)})
    return {"format": calibration.FORMAT, "device": device, **running(), "date": "2026-01-01T00:00:00Z",
            **({"kernels": kernels} if kernels else {}), **header, "rows": rows}


def rows_winning_from(op: str, dtype: str, first: dict[int, int | None], buckets=range(14, 29, 2)) -> list[dict]:
    """Evidence rows of one (op, dtype): per width class (0 narrow, 1 wide) the first winning bucket (None: never)."""
    out = []
    for wide, start in first.items():
        cols = 8192 if wide else 1024
        for b in buckets:
            out.append({"dsl": "triton", "op": op, "dtype": dtype, "bucket": b, "shape": [max(1, (1 << (b - 1)) // cols), cols],
                        "last_dim": cols, "wins": start is not None and b >= start})
    return out


class Sources:
    """Every source of tables pointed at a temporary folder; NVML and the device key faked on demand."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.monkeypatch = monkeypatch
        self.shipped = tmp_path / "shipped"
        self.shipped.mkdir()
        self.cache_home = tmp_path / "cache"
        monkeypatch.setattr(sources, "PACKAGED_DIR", self.shipped)
        monkeypatch.setenv("XDG_CACHE_HOME", str(self.cache_home))
        monkeypatch.delenv(calibration.ENV_VAR, raising=False)
        self.gpus(None)

    @property
    def user_dir(self) -> Path:
        return sources.user_dir()

    def gpus(self, gpus: list[nvml.Gpu] | None) -> None:
        """What NVML answers: these GPUs, or None (no driver)."""
        found = None if gpus is None else tuple(gpus)
        self.monkeypatch.setattr(nvml, "devices", lambda: found)
        calibration.reset()

    def device(self, key: str | None) -> None:
        """Tensors (CPU ones, here) report ``key`` as their device key; None restores."""
        calibration.set_device_key_fn(None if key is None else (lambda device: key))

    def ship(self, content: dict, name: str | None = None) -> Path:
        path = self.shipped / (name or calibration.table_filename(content["device"]))
        path.write_text(json.dumps(content))
        calibration.reset()
        return path

    def user(self, content: dict, name: str | None = None) -> Path:
        folder = self.user_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (name or sources.user_table_filename(content["device"], sources.table_versions(content)))
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        calibration.reset()
        return path

    def env(self, value: str | Path | None) -> None:
        if value is None:
            self.monkeypatch.delenv(calibration.ENV_VAR, raising=False)
        else:
            self.monkeypatch.setenv(calibration.ENV_VAR, str(value))
        calibration.reset()


def recorded_registration(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Stand in for the registry's ``register``: ``{op: cond}`` as the dispatch core would route
    each registered override's cond, through every feature's wrapper (filled as the backend registers)."""
    import types

    from python_native.core import extensions
    from python_native.core.registry import REGISTRY

    recorded: dict[str, object] = {}

    def record(dsl, namespace, op, key, cond, impl, **options):
        handle = types.SimpleNamespace(dsl=dsl, op=op, dispatch_key=key, cond=cond, impl=impl, chosen_impl=impl)
        handle.functional = handle
        recorded[op] = extensions.routed_pieces(handle)[0]

    monkeypatch.setattr(REGISTRY, "register", record)
    return recorded


def routing_probe(shapes: tuple[tuple[int, int], ...]) -> str:
    """Script lines for a fresh process (``torch`` and ``pn`` imported): per softmax shape, then for
    silu, print the trace events of one call, which say whether the override ran, fell back or was
    not routed at all."""
    return textwrap.dedent(f"""
        for shape in {shapes!r}:
            with pn.trace() as t:
                y = torch.softmax(torch.randn(*shape), -1)
            torch.testing.assert_close(y.sum(-1), torch.ones(shape[0]))
            print(shape[0], [(e.op, e.dsl, e.outcome) for e in t.events])
        with pn.trace() as t:
            torch.nn.functional.silu(torch.randn(4, 64))
        print("silu", [(e.op, e.outcome) for e in t.events])
    """)
