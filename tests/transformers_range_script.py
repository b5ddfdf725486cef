"""One transformers release against the patch rules: run as a script, with that release first on the path.

For each family given (default: llama, qwen3, mistral) it builds the tiny fp32 causal LM, patches it,
and checks that the report routes the norms, the gated MLP, the rotary function and the causal-LM
loss; that one training step through the custom ops (the trace says they served) gives the
unpatched model's loss and gradients; and that ``pn.unpatch`` restores the original forwards and
function exactly. It prints one JSON line: the transformers version, and per family the report's
rows and any check that failed. The slow test runs it against the installed release and the oldest
one the rules are stated for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' shared helpers

import patch_testing as pt  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import python_native as pn  # noqa: E402

FAMILIES = ("llama", "qwen3", "mistral")
# rule -> the custom op it routes to (forward and backward are both checked in the trace)
WANTED = {"rms_norm": ("rms_norm", "rms_norm_backward"), "gated_mlp": ("swiglu", "swiglu_backward"),
          "rotary": ("rotary", "rotary_backward"),
          "causal_lm_loss": ("linear_cross_entropy.forward", "linear_cross_entropy.backward")}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def _forwards(model: torch.nn.Module) -> dict[str, object]:
    """What patching changes on a model: each module's instance ``forward``."""
    return {n: m.__dict__.get("forward") for n, m in model.named_modules()}


def check(family: str) -> dict[str, object]:
    """The family's rows of the report and the checks that failed (empty: all held)."""
    failed: list[str] = []
    reference, model = pt.model(family), pt.model(family)
    batch = pt.inputs(model)
    modeling = sys.modules[type(model).__module__]
    rotary_before = getattr(modeling, "apply_rotary_pos_emb", None)
    forwards_before = _forwards(model)
    with pt.aten_overrides_off(), pt.serving():
        want_loss, want_grads = pt.step(reference, batch)
        report = pn.patch(model)
        rows = [[e.rule, e.target, e.status, e.detail] for e in report.entries]
        taken = {e.rule for e in report.patched}
        failed += [f"rule {r} did not patch" for r in WANTED if r not in taken]
        with pn.trace() as t:
            loss, grads = pt.step(model, batch)
        served = {e.op for e in t.events if e.outcome == "override"}
        failed += [f"op {op} was not served by an override" for ops in WANTED.values() for op in ops
                   if op not in served]
        if not _close(loss, want_loss):
            failed.append(f"loss {loss.item()} != unpatched {want_loss.item()}")
        if grads.keys() != want_grads.keys():
            failed.append(f"gradients of other parameters: {sorted(grads.keys() ^ want_grads.keys())}")
        failed += [f"gradient of {n} differs" for n in want_grads if n in grads and not _close(grads[n], want_grads[n])]
        pn.unpatch(model)
        if _forwards(model) != forwards_before:
            failed.append("unpatch left an instance forward behind")
        if getattr(modeling, "apply_rotary_pos_emb", None) is not rotary_before:
            failed.append("unpatch left apply_rotary_pos_emb replaced")
        again, again_grads = pt.step(model, batch)
        if not torch.equal(again, want_loss) or any(not torch.equal(again_grads[n], g) for n, g in want_grads.items()):
            failed.append("the unpatched model's step is not the original's bit for bit")
    return {"rows": rows, "failed": failed}


def main(families: list[str]) -> None:
    results = {family: check(family) for family in families}
    print(json.dumps({"transformers": transformers.__version__, "transformers_file": transformers.__file__,
                      "families": results}))


if __name__ == "__main__":
    main(sys.argv[1:] or list(FAMILIES))
