"""One training step of a Llama-shaped stack: unpatched, ``pn.patch``-ed, and Liger-Kernel's patch.

Run: ``python benchmarks/model_step.py [--device cpu|cuda] [--hidden H --layers L --seq S --batch B
--vocab V --dtype D] [--repeat R] [--threads T] [--modes eager,compiled] [--no-liger]``. Defaults on
CUDA: bfloat16, Llama 3 8B's shapes (hidden 4096, intermediate 14336, 32 heads of which 8 key-value
heads, vocabulary 128256) with 4 layers, one sequence of 4096 tokens.

On CPU (float32, one thread, the median of 30 steps after warm-up) it checks that patching never
slows a model where no override serves: two stacks, *tiny* (hidden 256, 2 layers) and *small*
(hidden 512, 4 layers), both of 2 x 128 tokens and a vocabulary of 4096, each run eager and under
``torch.compile``, unpatched and patched. Without Triton's interpreter no override of the declared
ops is installed at the CPU key, so every patched forward runs its module's own code: the ratio
measures what patching costs on its own (the target is at most 1.02x). The two models of a pair
are stepped in turn, one step each, so that drift in the machine's speed (other processes, clock)
falls on both alike. Shape arguments run that one stack instead of the two.

Each variant is a fresh ``LlamaForCausalLM`` built from the same config and seed (the default SDPA
attention), and one step is its forward with labels and the backward (no optimizer step):

- *unpatched*: the model as transformers builds it; the package's overrides of aten ops serve
  whatever calls reach them, as for any user who installed it;
- *patched*: after ``pn.patch(model)``: norms, the gated MLP, the rotary embedding and the loss
  (fused, from the hidden states) run through the package's ops;
- *Liger-Kernel*: after ``apply_liger_kernel_to_llama(model=model)``, where Liger-Kernel is
  installed and the device is a GPU. It runs last: it patches transformers' classes for the process.

Time is the median of ``--repeat`` steps after warm-up steps (CUDA events around each step on
a GPU); peak memory is the most the step allocates at once above what the model holds before it
(``python_native.tools.bench.memory``). Ratios are against *unpatched*, measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

import torch

import python_native as pn
from python_native.tools.bench.memory import peak_bytes
from python_native.tools.bench.timing import cpu_timer, gpu_throughput_timer

SHAPES = ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab", "seq", "batch")
GPU_STACK = {"hidden": 4096, "intermediate": 14336, "layers": 4, "heads": 32, "kv_heads": 8, "vocab": 128256,
             "seq": 4096, "batch": 1}
CPU_STACKS = {
    "tiny": {"hidden": 256, "intermediate": 688, "layers": 2, "heads": 8, "kv_heads": 2, "vocab": 4096,
             "seq": 128, "batch": 2},
    "small": {"hidden": 512, "intermediate": 1376, "layers": 4, "heads": 8, "kv_heads": 2, "vocab": 4096,
              "seq": 128, "batch": 2},
}
MODES = ("eager", "compiled")


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"--modes takes a comma-separated list of {list(MODES)}, got {text!r}")
    return modes


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    for name in SHAPES:
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeat", type=int, help="timed steps per variant (default: 30 on CPU, 5 on CUDA)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads; CPU only)")
    p.add_argument("--modes", type=_modes, help="eager, compiled or both (default: both on CPU, eager on CUDA)")
    p.add_argument("--no-liger", action="store_true", help="leave Liger-Kernel out even where installed")
    args = p.parse_args()
    gpu = args.device == "cuda"
    args.custom = any(getattr(args, key) is not None for key in SHAPES)
    for key, value in (GPU_STACK if gpu else CPU_STACKS["tiny"]).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    args.repeat = args.repeat or (5 if gpu else 30)
    args.modes = args.modes or (["eager"] if gpu else list(MODES))
    if args.repeat < 1 or args.threads < 1:
        p.error(f"--repeat and --threads must be at least 1, got {args.repeat} and {args.threads}")
    return args


def build(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         max_position_embeddings=max(args.seq, 128), tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(config)
    return model.to(args.dtype).train()


def _patched(model: torch.nn.Module) -> None:
    report = pn.patch(model)
    print(f"  pn.patch: {', '.join(f'{e.rule} x{e.instances}' for e in report.patched)}"
          + "".join(f"\n    left alone: {e.target}: {e.detail}" for e in report.left_alone))


def _liger(model: torch.nn.Module) -> None:
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(model=model)


def variants(args: argparse.Namespace) -> dict[str, Callable[[torch.nn.Module], None]]:
    out: dict[str, Callable[[torch.nn.Module], None]] = {"unpatched": lambda model: None, "patched": _patched}
    if args.device == "cuda" and not args.no_liger:
        try:
            import liger_kernel.transformers  # noqa: F401
        except Exception as e:
            print(f"  Liger-Kernel left out: {type(e).__name__}: {e}")
        else:
            out["Liger-Kernel"] = _liger
    return out


def measure(args: argparse.Namespace, prepare: Callable[[torch.nn.Module], None]) -> tuple[int, float]:
    model = build(args)
    prepare(model)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(args.device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    step()  # the first launches and the allocator's pools
    model.zero_grad(set_to_none=True)
    peak = peak_bytes(step, args.device)
    # One step per sample (a step is far longer than a launch), the median of --repeat samples.
    timer = gpu_throughput_timer(loops=args.repeat, budget_ms=0.0) if args.device == "cuda" else cpu_timer(args.repeat)
    step()
    ms = timer(step, [])
    return peak, ms


def release(device: str) -> None:
    """The last variant's model gone before the next is built (one model in memory at a time)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def describe(args: argparse.Namespace, name: str) -> str:
    return (f"Llama-shaped stack: hidden {args.hidden}, intermediate {args.intermediate}, {args.layers} layers, "
            f"{args.heads} heads ({args.kv_heads} kv), vocabulary {args.vocab}; batch {args.batch} x sequence "
            f"{args.seq}; {str(args.dtype).removeprefix('torch.')} on {name} (torch {torch.__version__})")


def main() -> None:
    args = parse()
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SystemExit("model_step.py builds its models with transformers: pip install transformers") from None
    if args.device == "cpu":
        cpu_suite(args)
        return
    print(describe(args, torch.cuda.get_device_name()))
    rows = []
    for label, prepare in variants(args).items():
        try:
            peak, ms = measure(args, prepare)
        except Exception as e:  # one variant failing (an incompatible Liger) must not lose the others
            print(f"  {label}: failed: {type(e).__name__}: {e}")
            continue
        finally:
            release(args.device)
        rows.append((label, peak, ms))
    if not rows or rows[0][0] != "unpatched":
        raise SystemExit("the unpatched model failed: no baseline to compare with")
    print(ratio_table(rows))


def ratio_table(rows: list[tuple[str, int, float]]) -> str:
    """(variant, peak bytes, step ms) rows, each with its ratios against the first (unpatched)."""
    _, base_peak, base_ms = rows[0]
    cells = [("variant", "step ms", "vs unpatched", "peak MiB", "vs unpatched")]
    cells += [(label, f"{ms:.1f}", f"{ms / base_ms:.2f}x", f"{peak / 2**20:.1f}", f"{peak / base_peak:.2f}x")
              for label, peak, ms in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in cells)


def paired_steps(args: argparse.Namespace, mode: str) -> dict[str, float]:
    """Median step ms of the unpatched and the patched model, stepped in turn (``mode``: eager or
    compiled); each compiles and warms up before the timed steps."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    steps: dict[str, Callable[[], None]] = {}
    for label, prepare in (("unpatched", lambda model: None), ("patched", pn.patch)):
        model = build(args)
        prepare(model)
        runner = torch.compile(model) if mode == "compiled" else model

        def step(model: torch.nn.Module = model, runner: Callable[..., object] = runner) -> None:
            model.zero_grad(set_to_none=True)
            runner(input_ids=ids, labels=ids).loss.backward()

        steps[label] = step
    for _ in range(3):  # compilation, the allocator's pools, first calls
        for step in steps.values():
            step()
    samples: dict[str, list[float]] = {label: [] for label in steps}
    order = list(steps)
    for i in range(args.repeat):
        for label in order if i % 2 == 0 else order[::-1]:  # neither goes first every time
            start = time.perf_counter()
            steps[label]()
            samples[label].append((time.perf_counter() - start) * 1e3)
    return {label: statistics.median(values) for label, values in samples.items()}


def cpu_suite(args: argparse.Namespace) -> None:
    """Patched against unpatched step time on CPU, per stack and mode, as ratios from one run."""
    torch.set_num_threads(args.threads)
    interpreter = os.environ.get("PYTHON_NATIVE_TRITON_INTERPRET", "0") not in ("", "0")
    stacks = {"custom": {k: getattr(args, k) for k in SHAPES}} if args.custom else CPU_STACKS
    print(f"CPU, {args.threads} thread(s), median of {args.repeat} steps after 3 warm-up steps; Triton's "
          f"interpreter {'ON: the overrides run there, times are the interpreter' if interpreter else 'off'}")
    print("  pn.patch: " + ", ".join(f"{e.rule} x{e.instances}" for e in pn.patch(build(args)).patched))
    rows = [("stack", "mode", "unpatched ms", "patched ms", "patched vs unpatched")]
    for name, shape in stacks.items():
        shaped = argparse.Namespace(**{**vars(args), **shape})
        print(f"{name}: {describe(shaped, 'CPU')}")
        for mode in args.modes:
            torch._dynamo.reset()
            ms = paired_steps(shaped, mode)
            rows.append((name, mode, f"{ms['unpatched']:.2f}", f"{ms['patched']:.2f}",
                         f"{ms['patched'] / ms['unpatched']:.3f}x"))
            release("cpu")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                    for row in rows))


if __name__ == "__main__":
    main()
