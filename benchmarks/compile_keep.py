"""What ``pn.compile_mode = "keep"`` costs a compiled function, against the same function in "bypass".

Run: ``python benchmarks/compile_keep.py [--device cpu|cuda]``. The function is
``softmax(x * 2, -1) + 1``, compiled with Inductor. Figures (medians, µs per call):

- *bypass*: compiled in "bypass": Inductor fuses everything into its own kernels;
- *keep*: compiled in "keep": the mul and add are Inductor's, ``_softmax`` is an extern call to
  ``python_native::_softmax``, which reaches the override through the dispatcher;
- *keep, op disabled*: the "keep" graph timed inside one ``operations_disabled("_softmax")`` scope:
  the extern call reaches aten's kernel, so this isolates the price of the opaque call itself;
- *eager*: the function uncompiled, override firing.

Host time is the wall time of one call as the caller sees it (on CUDA: launch work, no sync).
Device time comes from CUDA events around the call; on CPU the host time is the whole cost.
On CUDA the Triton overrides are used when python-native installed them there; otherwise (and on
CPU) a Python override written with aten ops stands in, registered at the device's key.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import timeit
import types
import warnings

import torch
from packaging.version import Version

import python_native as pn

warnings.filterwarnings("ignore")

SIZES = {"tiny": (8, 16), "large": (2048, 1024)}


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 2, dim=-1) + 1


def fresh_copy(fn):
    """The same function with its own code object, so Dynamo keeps a separate cache for it."""
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_copy"), fn.__globals__, fn.__name__)


def python_softmax(self, dim, half_to_float):
    shifted = self - self.amax(dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim, keepdim=True)


def ensure_override(device: str) -> str:
    key = "CUDA" if device == "cuda" else "CPU"
    if any(h.op == "_softmax" and h.dispatch_key == key for h in pn.overrides()):
        return "the registered override"
    if "bench" not in pn.all_dsls:
        pn.register_dsl("bench", types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("0")))
    pn.register_op_override("bench", "aten", "_softmax", key, None, python_softmax, unconditional_override=True)
    return "a Python override made of aten ops"


def host_us(fn, sync, number: int, repeat: int) -> float:
    fn()
    sync()
    times = timeit.repeat(fn, number=number, repeat=repeat)
    sync()
    return statistics.median(times) / number * 1e6


def device_us(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    device = args.device
    which = ensure_override(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    on_cuda = device == "cuda"
    print(f"torch {torch.__version__}, device {device}, override: {which}")
    print(f"{'size':<6} {'variant':<20} {'host µs':>10} {'device µs':>10} {'vs bypass':>10}")
    for label, shape in SIZES.items():
        x = torch.randn(*shape, device=device)
        number = 200 if label == "tiny" else 5
        base = None
        for name, (call, scope) in variants_for(x).items():
            with scope():
                host = host_us(call, sync, number, args.repeat)
                dev = device_us(call, args.repeat) if on_cuda else None
            base = base if base is not None else (dev if dev is not None else host)
            ratio = (dev if dev is not None else host) / base
            dev_text = f"{dev:10.1f}" if dev is not None else f"{'-':>10}"
            print(f"{label:<6} {name:<20} {host:10.1f} {dev_text} {ratio:9.2f}x")


def variants_for(x: torch.Tensor) -> dict[str, tuple]:
    """The four ways of running the function on ``x`` (call, scope held while timing), checked first."""
    compiled = {}
    for mode in ("bypass", "keep"):
        with pn.compile_mode_set(mode):
            fn = torch.compile(fresh_copy(scaled_softmax), dynamic=False)
            fn(x)  # compiles now, in this mode
        compiled[mode] = fn
    reference = scaled_softmax(x)
    for fn in compiled.values():
        torch.testing.assert_close(fn(x), reference)

    def keep_call():
        return compiled["keep"](x)

    return {
        "bypass": (lambda: compiled["bypass"](x), contextlib.nullcontext),
        "keep": (keep_call, contextlib.nullcontext),
        "keep, op disabled": (keep_call, lambda: pn.operations_disabled("_softmax")),
        "eager (override)": (lambda: scaled_softmax(x), contextlib.nullcontext),
    }

if __name__ == "__main__":
    main()
