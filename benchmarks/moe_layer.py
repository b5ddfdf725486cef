"""Time and peak memory of one mixture-of-experts layer, forward and backward: transformers' experts
implementations against the package's ops, in one run.

Run: ``python benchmarks/moe_layer.py [--shape qwen3_moe|mixtral|both] [--tokens N] [--dtype bfloat16]
[--repeat R] [--small] [--interpreted]``. Shapes (a GPU's defaults, 8192 tokens in bfloat16):

- ``qwen3_moe``: Qwen3-30B-A3B's layer: hidden 2048, expert intermediate 768, 128 experts, 8 per token;
- ``mixtral``: Mixtral 8x7B's: hidden 4096, intermediate 14336, 8 experts, 2 per token.

``--small`` scales every size down (hidden 64, intermediate 32, 8 experts, 256 tokens, float32) so
the script runs on a CPU in seconds: that proves it starts and its variants agree; only a GPU's
figures mean anything. Each variant runs the layer's block (router, experts) forward, then backward
from a fixed random gradient, on the same weights and inputs:

- *eager*: transformers' Python loop over the experts hit (``experts_implementation="eager"``), every DSL off;
- *grouped_mm*: transformers' ``grouped_mm`` path (the default), every DSL off;
- *python-native*: the block after ``pn.patch``: ``moe_route`` and ``moe_experts`` served by the Triton
  kernels (on a GPU; on a CPU only with ``--interpreted``, where the interpreter's time means nothing);
- *liger*: where Liger-Kernel is installed, the experts' forward replaced by Liger-Kernel's
  ``LigerExperts.forward`` (its fused MoE function on the module's own stacked weights, as its
  ``apply_liger_kernel_to_*`` does), every DSL off, the router transformers' (same GPU/CPU rule).

The package's MoE overrides are not yet measured against the references on any GPU, so this
script sets ``PYTHON_NATIVE_UNMEASURED=1`` (unless set) to install them at the CUDA key. Peak memory
is the most the step holds at once beyond what existed before it
(``python_native.tools.bench.memory``); time is the median of ``--repeat`` steps after a warm-up.
Ratios are against *eager*, measured in the same run; *moe ops by* names the DSL that served the
package's MoE ops in the variant's first step (from its trace). MoE layers are GEMM-bound: *TFLOP/s* is
the experts' GEMM FLOPs of a forward and backward (the ``moe_experts`` bench row's ``flops``) over the step's time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("PYTHON_NATIVE_UNMEASURED", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import python_native as pn  # noqa: E402
from python_native.tools.bench.memory import peak_bytes  # noqa: E402
from python_native.tools.bench.rows import DECLARED  # noqa: E402
from python_native.tools.bench.timing import median_ms  # noqa: E402

SHAPES = {  # name -> (config type, config arguments)
    "qwen3_moe": ("qwen3_moe", dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128,
                                    num_experts_per_tok=8, norm_topk_prob=True)),
    "mixtral": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2)),
}
SMALL = dict(hidden_size=64, moe_intermediate_size=32, intermediate_size=32, num_experts=8, num_local_experts=8)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--small", action="store_true", help="every size scaled down: the CPU check that it runs")
    p.add_argument("--interpreted", action="store_true", help="on CPU, also run the Triton kernels (interpreter)")
    args = p.parse_args()
    args.tokens = args.tokens or (256 if args.small else 8192)
    args.dtype = getattr(torch, args.dtype or ("float32" if args.small or args.device == "cpu" else "bfloat16"))
    return args


def block(shape: str, small: bool, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The family's sparse MoE block at the shape, randomly initialised."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    family, sizes = SHAPES[shape]
    fields = AutoConfig.for_model(family).to_dict()
    config = CONFIG_MAPPING[family](**{**sizes, **({k: v for k, v in SMALL.items() if k in fields} if small else {})})
    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
    torch.manual_seed(0)
    with torch.device(device):
        layer = Block(config)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02)
    return layer.to(dtype)


def no_dsls() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for name in pn.all_dsls:
        stack.enter_context(getattr(pn, name).disabled())
    return stack


def variants(layer: torch.nn.Module, device: str, interpreted: bool) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """name -> the scope one step of that variant runs in."""
    def implementation(name: str):
        @contextlib.contextmanager
        def scope():
            layer.experts.config._experts_implementation = name
            with no_dsls():
                yield
        return scope

    found = {"eager": implementation("eager"), "grouped_mm": implementation("grouped_mm")}
    if device == "cuda" or interpreted:
        @contextlib.contextmanager
        def patched():
            with pn.patched(layer, ["moe_router", "moe_experts"]):
                yield
        found["python-native"] = patched
        if importlib.util.find_spec("liger_kernel") is not None:
            found["liger"] = liger(layer)
    return found


def liger(layer: torch.nn.Module) -> Callable[[], contextlib.AbstractContextManager]:
    """The scope of the Liger-Kernel variant: the experts run Liger's forward, as its patching binds it."""
    from liger_kernel.transformers.swiglu import LigerExperts

    @contextlib.contextmanager
    def scope():
        layer.experts.forward = types.MethodType(LigerExperts.forward, layer.experts)
        try:
            with no_dsls():
                yield
        finally:
            del layer.experts.forward
    return scope


def run(shape: str, args: argparse.Namespace) -> None:
    layer = block(shape, args.small, args.dtype, args.device)
    hidden = layer.gate.weight.shape[1]
    x = torch.randn(1, args.tokens, hidden, device=args.device).to(args.dtype).requires_grad_(True)
    grad = torch.randn(1, args.tokens, hidden, device=args.device).to(args.dtype)
    experts, inner = layer.experts.gate_up_proj.shape[0], layer.experts.gate_up_proj.shape[1] // 2
    flops = DECLARED["moe_experts"].flops((args.tokens, hidden, inner, experts, layer.gate.top_k), "fwd+bwd")
    print(f"{shape}: {args.tokens} tokens, hidden {hidden}, {experts} experts, "
          f"{layer.gate.top_k} per token, {str(args.dtype).removeprefix('torch.')}, on {args.device}")
    if importlib.util.find_spec("liger_kernel") is None:
        print("no liger row: Liger-Kernel is not installed")
    elif args.device != "cuda" and not args.interpreted:
        print("no liger row: its Triton kernels need a GPU (or --interpreted on a CPU)")
    print(f"{'variant':<15} {'moe ops by':>10} {'peak MiB':>10} {'vs eager':>9} {'ms':>10} {'vs eager':>9} "
          f"{'TFLOP/s':>8} {'max |diff| vs eager':>20}", flush=True)
    base, outputs = None, {}
    for name, scope in variants(layer, args.device, args.interpreted).items():
        def step(scope=scope):
            x.grad = None
            layer.zero_grad(set_to_none=True)
            with scope():
                out = layer(x)
                out.backward(grad)
            return out

        with pn.trace() as t:  # warm-up: first launches, the allocator, the probe
            outputs[name] = step().detach().float()
        served = ",".join(sorted({e.dsl for e in t.events if e.op.startswith("moe_") and e.outcome == "override"}))
        peak, ms = peak_bytes(step, args.device), median_ms(step, args.device, args.repeat)
        base = base or (peak, ms)  # eager, the first variant, is what the ratios are against
        diff = float((outputs[name] - outputs["eager"]).abs().max())
        # Each row as soon as it is measured: a run cut short by a time limit keeps the rows it finished.
        print(f"{name:<15} {served or '-':>10} {peak / 2**20:>10.1f} {peak / max(base[0], 1):>8.2f}x {ms:>10.2f} "
              f"{ms / base[1]:>8.2f}x {flops / (ms * 1e-3) / 1e12:>8.2f} {diff:>20.3g}", flush=True)


def main() -> None:
    args = parse()
    for shape in (SHAPES if args.shape == "both" else [args.shape]):
        run(shape, args)


if __name__ == "__main__":
    main()
