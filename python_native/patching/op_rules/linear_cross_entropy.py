"""The causal-LM loss rule: the loss from the hidden states through ``linear_cross_entropy``
(``python_native/ops/linear_cross_entropy_op.py``).

A causal LM computes ``logits = lm_head(hidden)`` over the whole vocabulary, upcasts them to fp32
and takes the cross-entropy of the logits shifted by one token: the largest tensors of a training
step. The rule takes a module with an output projection (``get_output_embeddings()`` or
``lm_head``, an ``nn.Linear``) whose forward accepts ``labels``. Its probe runs the model's own
forward once on a few random tokens, with the projection's input recorded, and requires that:

- the projection ran once and the returned logits are its output as they stand (no final logit
  softcapping, no scaling: the fused op takes the projection's output as the logits);
- the returned loss is the fused loss of those hidden states: the labels shifted by one,
  ``ignore_index`` ignored, the mean over the kept tokens (or the sum over ``num_items_in_batch``).

The fused loss serves only where no one wants the logits: a call with ``labels`` while the model
is in training mode (read from the output projection's ``training`` flag, which ``model.train()``
and ``model.eval()`` set with the model's, and which a shallow copy of the model shares). It runs
the model's forward without the labels while the projection hands back a placeholder (a zero
expanded to the logits' shape: no memory) and records its input; the loss is then computed from those hidden states with the call's
``ignore_index``, ``shift_labels`` and ``num_items_in_batch``. The output carries that loss and no
logits. In eval mode (``model.eval()``: evaluation, ``Trainer.evaluate``, metrics from logits) the
model's own forward runs, and returns its logits and loss exactly as unpatched. transformers'
forwards take no argument asking for logits, so a training-mode caller that wants them calls
without ``labels`` (and takes the loss of the logits itself) or patches without this rule. Calls
the probe did not cover (``logits_to_keep``, ``return_dict=False``, an auxiliary loss in the
output) run the model's own forward with the labels. Each call the model's own forward serves
with labels says why in an open trace (a ``fallback`` event).

The replacement runs the model's own forward on every call, so what that forward does besides
computing stays (``keeps_forward``). The probe's run leaves no trace on the model (the installer
puts its state back); a submodule whose forward declares a ``global`` or ``nonlocal``, or prints,
would act once more than called, so such a model's loss is left alone.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from python_native.ops import linear_cross_entropy_op as lce
from python_native.patching import effects, probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

OP = "linear_cross_entropy.forward"
_CONFIG_HINTS = ("softcap", "logit_scale", "logits_scaling", "logit_multiplier")
PRIORITY = 20  # a whole causal LM: after the rules of the modules it holds


@dataclasses.dataclass(frozen=True)
class LossPlan:
    head: str  # the output projection's name within the module
    labels_at: int  # the position of ``labels`` among the forward's parameters (self excluded)

    def describe(self) -> str:
        return f"linear_cross_entropy from {self.head}'s input: label shift, ignore_index, mean or num_items_in_batch"


def _head(module: nn.Module) -> tuple[str, nn.Linear] | None:
    getter = getattr(module, "get_output_embeddings", None)
    head = probe.attempt(getter) if callable(getter) else getattr(module, "lm_head", None)
    if not isinstance(head, nn.Linear):
        return None
    name = next((n for n, m in module.named_modules() if m is head and n), None)
    return None if name is None else (name, head)


def fused_loss(head: nn.Linear, hidden: torch.Tensor, labels: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    """The loss transformers' causal-LM loss computes from ``head(hidden)``, without the logits."""
    ignore_index = options.get("ignore_index", -100)
    shifted = options.get("shift_labels")
    if shifted is None:
        shifted = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shifted.reshape(-1).to(hidden.device)
    x = hidden.reshape(-1, hidden.shape[-1])
    runtime.routing(OP, x)
    # Per-token losses in fp32 (never rounded to a half-precision model's dtype), reduced in fp32:
    # the loss keeps fp32's precision, as transformers' loss of fp32 copies of the logits does.
    per_token = lce.full_precision_loss(x, head.weight, target, head.bias, "none", ignore_index).float()
    count = options.get("num_items_in_batch")
    if count is None:
        return per_token.sum() / (target != ignore_index).sum()
    return per_token.sum() / (count.to(per_token.device) if torch.is_tensor(count) else count)


def _config_hint(module: nn.Module) -> str:
    config = getattr(module, "config", None)
    found = {k: v for k, v in (vars(config).items() if config is not None else ())
             if any(h in k for h in _CONFIG_HINTS) and "attn" not in k and v not in (None, 0, 1, 1.0, False)}
    return f" (config: {', '.join(f'{k}={v}' for k, v in sorted(found.items()))})" if found else ""


def _probe_forward(module: nn.Module, head: nn.Linear) -> tuple[Any, list[torch.Tensor]]:
    """The module's own forward on a few random tokens, with the projection's inputs recorded."""
    seen: list[torch.Tensor] = []
    original = head.forward

    def recording(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return original(x)

    g = torch.Generator().manual_seed(probe.SEED)
    ids = torch.randint(0, head.out_features, (2, 8), generator=g).to(head.weight.device)
    head.__dict__["forward"] = recording
    try:
        out = type(module).forward(module, input_ids=ids, labels=ids)
    finally:
        del head.__dict__["forward"]
    return (out, ids), seen


def match_causal_lm_loss(module: nn.Module) -> LossPlan | LeftAlone | None:
    found = _head(module)
    try:
        params = list(inspect.signature(type(module).forward).parameters)[1:]
    except (TypeError, ValueError):
        return None
    if found is None or "labels" not in params or "input_ids" not in params:
        return None
    name, head = found
    if probe.is_meta(module):
        return LeftAlone("parameters on the meta device: no probe can run the forward")
    own = effects.writes(type(head).forward, f"{name}'s forward", owner=type(head))
    if own is not None:
        return LeftAlone(f"{own}: the fused loss would not run it")
    outside = next((why for m in module.modules()
                    if (why := effects.writes(type(m).forward, f"{type(m).__name__}'s forward", ("global", "print"), type(m)))),
                   None)
    if outside is not None:
        return LeftAlone(f"{outside}: the probe would run it once more than called")
    try:
        (out, ids), seen = _probe_forward(module, head)
    except Exception as e:
        return LeftAlone(f"the probe forward (input_ids and labels alone) raised {type(e).__name__}: {e}")
    loss, logits = getattr(out, "loss", None), getattr(out, "logits", None)
    if not isinstance(loss, torch.Tensor) or not isinstance(logits, torch.Tensor) or len(seen) != 1:
        return LeftAlone(f"the forward does not return loss and logits from one call of {name} ({len(seen)} calls)")
    if not probe.same(logits, head(seen[0])):
        return LeftAlone(f"the logits are transformed after {name}{_config_hint(module)}: "
                         "the fused loss takes the projection's output as the logits")
    if head.weight.dtype != seen[0].dtype:
        return LeftAlone(f"{name} takes {seen[0].dtype} hidden states with a {head.weight.dtype} weight")
    fused = fused_loss(head, seen[0], ids, {})
    rtol = 1e-4 if head.weight.dtype in (torch.float32, torch.float64) else 2e-2
    if not probe.close(loss.float(), fused, rtol=rtol, atol=rtol):
        return LeftAlone(f"its loss ({loss.item():.6g}) is not the shifted cross-entropy of the logits "
                         f"({fused.item():.6g}): an auxiliary term, label smoothing or a loss of its own")
    return LossPlan(name, params.index("labels"))


def _unfusable(head: nn.Module, kwargs: dict[str, Any], labels: Any) -> str | None:
    if not head.training:  # the projection's flag: a shallow copy of the model shares it, and sets it with its own
        return "eval mode: the model's own forward ran and returned its logits"
    if kwargs.get("logits_to_keep") not in (None, 0):
        return "logits_to_keep: the model's own forward ran"
    if kwargs.get("return_dict") is False:
        return "return_dict=False: the model's own forward ran"
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point():
        return "labels are not a tensor of class indices: the model's own forward ran"
    return None


def replace_causal_lm_loss(module: nn.Module, plan: LossPlan):
    original = runtime.own_forward(module)
    head = module.get_submodule(plan.head)
    head_original = runtime.own_forward(head)
    state = runtime.state

    def forward(*args: Any, **kwargs: Any) -> Any:
        at = plan.labels_at
        labels = args[at] if len(args) > at else kwargs.get("labels")
        why = None if labels is None else _unfusable(head, kwargs, labels)
        if labels is None or why is not None:
            if why is not None:
                runtime.declined(OP, labels if isinstance(labels, torch.Tensor) else head.weight, why)
            return original(*args, **kwargs)
        call_args = (*args[:at], None, *args[at + 1:]) if len(args) > at else args
        call_kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
        previous, slot = state.capture, []
        state.capture = slot
        try:
            out = original(*call_args, **call_kwargs)
        finally:
            state.capture = previous
        if (len(slot) != 1 or not hasattr(out, "items") or getattr(out, "aux_loss", None) is not None
                or (slot[0].dtype != head.weight.dtype and not torch.is_autocast_enabled(slot[0].device.type))):
            runtime.declined(OP, labels, "the output carries more than logits (an auxiliary loss?) or the projection "
                             "ran other than once: the model's own forward ran again with the labels")
            return original(*args, **kwargs)
        loss = fused_loss(head, slot[0], labels, kwargs)
        return type(out)(**{k: v for k, v in out.items() if k not in ("logits", "loss")}, loss=loss)

    def head_forward(x: torch.Tensor) -> torch.Tensor:
        slot = state.capture
        if slot is None:
            return head_original(x)
        slot.append(x)
        return x.new_zeros(()).expand(*x.shape[:-1], head.out_features)  # a placeholder: no memory

    return {module: forward, head: head_forward}


RULES = [PatchRule("causal_lm_loss", match_causal_lm_loss, replace_causal_lm_loss, ops=("linear_cross_entropy",),
                   description="the causal-LM loss, fused from the hidden states (no logits materialised)",
                   keeps_forward=True)]
