"""transformers' ``Trainer.evaluate`` on a patched model: evaluation runs in eval mode, where the
patched causal LM returns its logits (the fused loss serves training steps only), so
``compute_metrics`` gets them and the metrics and ``eval_loss`` are the unpatched model's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

# isort: split
from patch_testing import aten_overrides_off, model, serving

import python_native as pn

ROWS, SEQ, VOCAB = 8, 16, 256


def _rows() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(3, VOCAB, (SEQ,), generator=g)), "labels": ids.clone()}
            for _ in range(ROWS)]


def _metrics(seen: list[tuple[int, ...]]):
    """``compute_metrics`` from the logits: next-token accuracy and mean log-probability of the
    label (``seen`` records the shape of the logits it was given)."""

    def compute(prediction) -> dict[str, float]:
        logits = prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        seen.append(tuple(logits.shape))
        labels = prediction.label_ids[:, 1:]
        logits = torch.from_numpy(np.asarray(logits[:, :-1], dtype=np.float64))
        logp = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(labels)[..., None].long())
        return {"accuracy": float((logits.argmax(-1).numpy() == labels).mean()), "log_prob": float(logp.mean())}

    return compute


def _evaluate(m: torch.nn.Module, tmp_path, seen: list) -> dict[str, float]:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True,
                             save_strategy="no")
    return Trainer(model=m, args=args, eval_dataset=_rows(), compute_metrics=_metrics(seen)).evaluate()


@pytest.mark.override
def test_trainer_evaluate_gives_compute_metrics_the_logits_and_the_unpatched_metrics(tmp_path):
    m = model("llama")  # in training mode, as after training: evaluate switches it
    plain_seen: list = []
    patched_seen: list = []
    with serving(), aten_overrides_off():
        plain = _evaluate(m, tmp_path / "plain", plain_seen)
        m.train()
        with pn.patched(m), pn.trace() as t:
            patched = _evaluate(m, tmp_path / "patched", patched_seen)
    assert patched_seen == plain_seen == [(ROWS, SEQ, VOCAB)]  # the patched eval got the whole logits
    assert patched["eval_loss"] == pytest.approx(plain["eval_loss"], rel=1e-5)
    assert patched["eval_accuracy"] == plain["eval_accuracy"]
    assert patched["eval_log_prob"] == pytest.approx(plain["eval_log_prob"], rel=1e-5)
    # The overrides served the evaluation; the loss's own forward ran, in eval mode, once per batch.
    served = {(e.op, e.module) for e in t.events if e.outcome == "override"}
    assert ("swiglu", "model.layers.0.mlp") in served and ("rms_norm", "model.norm") in served, served
    reasons = [e.reason for e in t.events if e.op.startswith("linear_cross_entropy")]
    assert len(reasons) == ROWS // 4 and all("eval mode" in r for r in reasons), reasons
