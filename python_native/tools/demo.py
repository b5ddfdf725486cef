"""``python -m python_native demo``: a small transformer block with and without the Triton overrides.

The block (pre-norm attention and MLP, then a vocabulary head with cross-entropy) is plain torch.
One forward+backward runs under ``pn.trace()`` to show which overrides served which ops; the same
step then runs with ``pn.triton.disabled()`` to compare outputs and gradients against aten, and
both are timed.

On a machine without CUDA the kernels run through Triton's CPU interpreter, which must be
switched on before python-native is imported: ``PYTHON_NATIVE_TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import python_native as pn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Size:
    batch: int
    seq: int
    hidden: int
    heads: int
    vocab: int


SIZES = {
    "cpu": Size(batch=2, seq=16, hidden=64, heads=4, vocab=128),
    "cuda": Size(batch=8, seq=1024, hidden=1024, heads=16, vocab=32768),
}


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, followed by a vocabulary head."""

    def __init__(self, size: Size, norm: str, activation: str):
        super().__init__()
        make_norm = nn.LayerNorm if norm == "layer" else nn.RMSNorm
        self.heads = size.heads
        self.norm1 = make_norm(size.hidden)
        self.qkv = nn.Linear(size.hidden, 3 * size.hidden)
        self.proj = nn.Linear(size.hidden, size.hidden)
        self.norm2 = make_norm(size.hidden)
        self.up = nn.Linear(size.hidden, 4 * size.hidden)
        self.act = nn.GELU(approximate="tanh") if activation == "gelu" else nn.SiLU()
        self.down = nn.Linear(4 * size.hidden, size.hidden)
        self.norm_out = make_norm(size.hidden)
        self.head = nn.Linear(size.hidden, size.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, c))
        x = x + self.down(self.act(self.up(self.norm2(x))))
        return self.head(self.norm_out(x))


@dataclass
class Step:
    """One forward+backward: the loss, the logits and every gradient."""

    loss: torch.Tensor
    logits: torch.Tensor
    grads: dict[str, torch.Tensor]


def _step(model: Block, x: torch.Tensor, targets: torch.Tensor) -> Step:
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    loss.backward()
    grads = {"input": x.grad.detach()}
    grads.update({name: p.grad.detach().clone() for name, p in model.named_parameters()})
    return Step(loss.detach(), logits.detach(), grads)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*header), line, *(fmt.format(*r) for r in rows)])


def _why_not(device: str) -> str | None:
    """Why the Triton overrides cannot serve this run, or None."""
    import python_native_dsls.triton as backend

    reason = backend.unavailable_reason()
    if device == "cpu" and not backend.interpret_mode():
        return (
            "no CUDA device, and Triton's CPU interpreter is off. Run the demo on CPU with\n"
            "  PYTHON_NATIVE_TRITON_INTERPRET=1 python -m python_native demo"
        )
    if reason is not None:
        return f"the triton backend is unavailable: {reason}"
    if not pn.get_dsl_operations("triton"):
        return "the triton backend registered no overrides (see `python -m python_native`)"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--norm", choices=["layer", "rms"], default="layer",
                        help="the block's norm: LayerNorm or RMSNorm (default: %(default)s)")
    parser.add_argument("--activation", choices=["gelu", "silu"], default="gelu",
                        help="the MLP's activation (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="dtype of the block and its input "
                        "(default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--repeats", type=int, help="timed runs per mode (default: 20 on CUDA, 3 on CPU)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights and the input, the same in both modes (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m python_native demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run(_parse(argv))


def collect(args: argparse.Namespace) -> dict:
    """Run the demo and return its results as plain data (what ``--json`` prints)."""
    import python_native_dsls.triton as backend

    # In interpreter mode the overrides sit at the CPU key, so the demo runs on CPU even with a GPU.
    use_cuda = torch.cuda.is_available() and not backend.interpret_mode()
    device = torch.device("cuda" if use_cuda else "cpu")
    problem = _why_not(device.type)
    if problem is not None:
        return {"ran": False, "reason": problem}

    size = SIZES[device.type]
    dtype = DTYPES[getattr(args, "dtype", None) or ("bfloat16" if device.type == "cuda" else "float32")]
    repeats = getattr(args, "repeats", None) or (20 if device.type == "cuda" else 3)
    torch.manual_seed(args.seed)
    model = Block(size, args.norm, args.activation).to(device=device, dtype=dtype)
    x = torch.randn(size.batch, size.seq, size.hidden, device=device, dtype=dtype)
    targets = torch.randint(size.vocab, (size.batch, size.seq), device=device)

    with pn.trace() as trace:
        ours = _step(model, x, targets)
    with pn.triton.disabled():
        ref = _step(model, x, targets)
    served = Counter(e.op for e in trace.events if e.dsl == "triton")
    aten = Counter(e.op for e in trace.events if e.outcome == "fallback")
    worst_param = max((n for n in ours.grads if n != "input"), key=lambda n: _max_diff(ours.grads[n], ref.grads[n]))

    on = _median_ms(lambda: _step(model, x, targets), device, repeats)
    with pn.triton.disabled():
        off = _median_ms(lambda: _step(model, x, targets), device, repeats)
    notes = []
    if args.norm == "rms" and "_fused_rms_norm" not in pn.get_dsl_operations("triton"):
        notes.append("RMS norm is not overridden here: this build has no _fused_rms_norm_backward kernel to fall back to")
    if device.type == "cpu":
        notes.append("on CPU the Triton kernels run in Triton's Python interpreter: these times are not kernel speed")
    return {
        "ran": True,
        "device": "CUDA: " + torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, Triton interpreter",
        "block": {
            "batch": size.batch, "seq": size.seq, "hidden": size.hidden, "heads": size.heads, "vocab": size.vocab,
            "norm": args.norm, "activation": args.activation, "dtype": str(dtype).removeprefix("torch."),
        },
        "routed": [
            {"op": op, "triton": served[op], "aten_declined": aten[op]} for op in sorted(served.keys() | aten.keys())
        ],
        "max_abs_diff": {
            "loss": _max_diff(ours.loss, ref.loss),
            "logits": _max_diff(ours.logits, ref.logits),
            "input_gradient": _max_diff(ours.grads["input"], ref.grads["input"]),
            "worst_parameter": worst_param,
            "worst_parameter_gradient": _max_diff(ours.grads[worst_param], ref.grads[worst_param]),
        },
        "median_ms": {"repeats": repeats, "triton_overrides": on, "aten_only": off},
        "speedup": off / on if device.type == "cuda" else None,
        "notes": notes,
    }


def render(r: dict) -> str:
    if not r["ran"]:
        return f"python-native demo: nothing to show here: {r['reason']}"
    b = r["block"]
    out = [
        f"python-native demo on {r['device']}",
        f"block: batch {b['batch']}, seq {b['seq']}, hidden {b['hidden']}, heads {b['heads']}, "
        f"vocab {b['vocab']}, {b['norm']} norm, {b['activation']}, {b['dtype']}",
    ]

    def section(title: str, body: str) -> None:
        out.extend(["", title, "=" * len(title), body])

    rows = [(x["op"], str(x["triton"]), str(x["aten_declined"])) for x in r["routed"]]
    section(
        "Ops routed during one forward+backward",
        _table(rows, ("op", "triton", "aten (declined)")) if rows else "no routed ops were called",
    )
    d = r["max_abs_diff"]
    rows = [
        ("loss", f"{d['loss']:.3e}"),
        ("logits", f"{d['logits']:.3e}"),
        ("input gradient", f"{d['input_gradient']:.3e}"),
        (f"parameter gradients (worst: {d['worst_parameter']})", f"{d['worst_parameter_gradient']:.3e}"),
    ]
    section("Largest absolute difference, overrides on vs. off", _table(rows, ("tensor", "max |diff|")))
    t = r["median_ms"]
    rows = [("triton overrides", f"{t['triton_overrides']:.2f}"), ("aten only", f"{t['aten_only']:.2f}")]
    section(f"Forward+backward time, median of {t['repeats']}", _table(rows, ("mode", "ms")))
    if r["speedup"] is not None:
        out.append(f"speed-up: {r['speedup']:.2f}x")
    out += [f"({note})" for note in r["notes"]]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    results = collect(args)
    print(json.dumps(results, indent=2) if getattr(args, "json", False) else render(results))
    return 0
