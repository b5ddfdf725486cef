"""``python_native::moe_route``: a mixture-of-experts router's logits to (routing weights, experts).

transformers' routers end in a few lines of torch after the logits' linear layer, and the families
differ only in their order and options, which this op's arguments name:

- ``scoring="softmax"``, ``topk_first=False`` (Mixtral, Qwen3-MoE, OLMoE): softmax in fp32, top-k
  of the probabilities, optionally divided by their sum (``renormalize``);
- ``scoring="softmax"``, ``topk_first=True`` (GPT-OSS): top-k of the logits, then their softmax in
  the logits' dtype;
- ``scoring="sigmoid"`` (DeepSeek-V3): sigmoid scores; experts chosen on the scores plus
  ``bias`` (a correction that takes no gradient) within the ``topk_group`` best of ``n_group``
  groups (a group's score: the sum of its two best); the weights are the plain scores gathered,
  renormalised over ``sum + renormalize_eps``.

``scaling`` then multiplies the weights (DeepSeek-V3's routed scaling factor); they are returned in
fp32 where ``keep_float`` (Mixtral keeps them so), in the logits' dtype otherwise. The reference
runs the modules' own calls in their order, so with no override serving, a patched router returns
the module's weights and indices bit for bit. ``moe_route_backward`` takes the weights' gradient to
the logits' one: the renormalisation's, then the softmax's or sigmoid's backward, through the
gathered positions (a scatter into zeros: each position is chosen once per row).
"""

from __future__ import annotations

import torch

from python_native.foundations import custom_ops, module_scope, public_names

Tensor = torch.Tensor

SCORINGS = ("softmax", "sigmoid")
OPTIONS = ("int top_k, str scoring='softmax', bool topk_first=False, bool renormalize=False, "
           "float renormalize_eps=0.0, Tensor? bias=None, int n_group=1, int topk_group=1, float scaling=1.0, "
           "bool keep_float=False")
SCHEMA = f"moe_route(Tensor logits, {OPTIONS}) -> (Tensor, Tensor)"
BACKWARD_SCHEMA = f"moe_route_backward(Tensor grad_weights, Tensor logits, Tensor indices, {OPTIONS}) -> Tensor"


def check_arguments(logits: Tensor, top_k: int, scoring: str, topk_first: bool, bias: Tensor | None,
                    n_group: int, topk_group: int) -> None:
    """``ValueError`` naming what the op cannot take (metadata only: FakeTensor safe)."""
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"moe_route: logits must be 2-D (tokens, experts) floating point, got "
                         f"{tuple(logits.shape)} {logits.dtype}")
    experts = logits.shape[1]
    if not 1 <= top_k <= experts:
        raise ValueError(f"moe_route: top_k={top_k}; allowed: 1 to the number of experts ({experts})")
    if scoring not in SCORINGS:
        raise ValueError(f"moe_route: scoring={scoring!r}; allowed: {list(SCORINGS)}")
    if scoring == "sigmoid" and topk_first:
        raise ValueError("moe_route: topk_first=True takes scoring='softmax' (the softmax of the top-k logits)")
    if bias is not None and (scoring != "sigmoid" or tuple(bias.shape) != (experts,)):
        raise ValueError(f"moe_route: bias must be 1-D of the number of experts ({experts}) with scoring='sigmoid', "
                         f"got {tuple(bias.shape)} with scoring={scoring!r}")
    if n_group < 1 or experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"moe_route: n_group={n_group}, topk_group={topk_group}; allowed: n_group dividing the "
                         f"{experts} experts and 1 <= topk_group <= n_group")
    if n_group > 1 and (scoring != "sigmoid" or experts // n_group < 2):
        raise ValueError(f"moe_route: n_group={n_group} (group-limited routing) takes scoring='sigmoid' and at "
                         f"least two experts per group")


def _sigmoid_choice(scores: Tensor, bias: Tensor | None, top_k: int, n_group: int, topk_group: int) -> Tensor:
    """The experts DeepSeek-V3 chooses: top-k of the biased scores within the best groups."""
    choice = scores if bias is None else scores + bias
    if n_group > 1:
        experts = scores.shape[1]
        group_scores = choice.view(-1, n_group, experts // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, experts // n_group).reshape(-1, experts)
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]


def _reference(logits: Tensor, top_k: int, scoring: str = "softmax", topk_first: bool = False,
               renormalize: bool = False, renormalize_eps: float = 0.0, bias: Tensor | None = None,
               n_group: int = 1, topk_group: int = 1, scaling: float = 1.0,
               keep_float: bool = False) -> tuple[Tensor, Tensor]:
    check_arguments(logits, top_k, scoring, topk_first, bias, n_group, topk_group)
    if topk_first:
        values, indices = torch.topk(logits, top_k, dim=-1)
        weights = torch.softmax(values, dim=1, dtype=values.dtype)
    else:
        if scoring == "softmax":
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, indices = torch.topk(scores, top_k, dim=-1)
        else:
            scores = logits.sigmoid()
            indices = _sigmoid_choice(scores, bias, top_k, n_group, topk_group)
            weights = scores.gather(1, indices)
        if renormalize:
            total = weights.sum(dim=-1, keepdim=True)
            weights = weights / (total + renormalize_eps if renormalize_eps else total)
    if scaling != 1.0:
        weights = weights * scaling
    return weights if keep_float else weights.to(logits.dtype), indices


def _reference_backward(grad_weights: Tensor, logits: Tensor, indices: Tensor, top_k: int,
                        scoring: str = "softmax", topk_first: bool = False, renormalize: bool = False,
                        renormalize_eps: float = 0.0, bias: Tensor | None = None, n_group: int = 1,
                        topk_group: int = 1, scaling: float = 1.0, keep_float: bool = False) -> Tensor:
    check_arguments(logits, top_k, scoring, topk_first, bias, n_group, topk_group)
    with torch.no_grad():
        if topk_first:  # softmax over the gathered logits, then scattered back
            values = logits.gather(1, indices)
            weights = torch.softmax(values, dim=1, dtype=values.dtype)
            grad = grad_weights.to(weights.dtype) * scaling
            grad_values = torch._softmax_backward_data(grad, weights, 1, values.dtype)
            return torch.zeros_like(logits).scatter_(1, indices, grad_values)
        work = torch.float32 if scoring == "softmax" else logits.dtype
        scores = torch.softmax(logits, -1, dtype=work) if scoring == "softmax" else logits.sigmoid()
        gathered = scores.gather(1, indices)
        grad = grad_weights.to(gathered.dtype) * scaling
        if renormalize:  # d(v / (s + eps)) = g / (s + eps) - sum(g * v) / (s + eps)^2
            total = gathered.sum(dim=-1, keepdim=True) + renormalize_eps
            grad = grad / total - (grad * gathered).sum(dim=-1, keepdim=True) / (total * total)
        grad_scores = torch.zeros_like(scores).scatter_(1, indices, grad)
        if scoring == "softmax":
            # The scores' own dtype as the input's: the softmax ran in float32 whatever the logits'
            # dtype (as the families' routers do), and CUDA's kernel takes no other pairing.
            grad_logits = torch._softmax_backward_data(grad_scores, scores, 1, scores.dtype)
        else:
            grad_logits = torch.ops.aten.sigmoid_backward(grad_scores, scores)
        return grad_logits.to(logits.dtype)


def _fake(logits: Tensor, top_k: int, scoring: str = "softmax", topk_first: bool = False,
          renormalize: bool = False, renormalize_eps: float = 0.0, bias: Tensor | None = None, n_group: int = 1,
          topk_group: int = 1, scaling: float = 1.0, keep_float: bool = False) -> tuple[Tensor, Tensor]:
    check_arguments(logits, top_k, scoring, topk_first, bias, n_group, topk_group)
    computed = torch.float32 if scoring == "softmax" and not topk_first else logits.dtype
    dtype = computed if keep_float else logits.dtype
    shape = (logits.shape[0], top_k)
    return logits.new_empty(shape, dtype=dtype), logits.new_empty(shape, dtype=torch.int64)


def _fake_backward(grad_weights: Tensor, logits: Tensor, indices: Tensor, top_k: int, *args) -> Tensor:
    return torch.empty_like(logits)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.options = tuple(inputs[1:])
    ctx.module = module_scope.current()


def _autograd_backward(ctx, grad_weights, grad_indices):
    logits, indices = ctx.saved_tensors
    needs = ctx.needs_input_grad
    grad_logits = None
    if needs[0] and grad_weights is not None:
        with module_scope.inside(ctx.module):
            grad_logits = BACKWARD(grad_weights, logits, indices, *ctx.options)
    return (grad_logits, *(None for _ in ctx.options))


OP = custom_ops.declare(SCHEMA, reference=_reference, fake=_fake, backward=_autograd_backward,
                      setup_context=_setup_context,
                      doc="a router's logits to (routing weights, expert indices): softmax or sigmoid, top-k, "
                          "renormalised, scaled")
BACKWARD = custom_ops.declare(BACKWARD_SCHEMA, reference=_reference_backward, fake=_fake_backward,
                            doc="the routing weights' gradient to the logits'")
public_names.declare("moe_route", "moe_route")
public_names.declare("moe_route", "moe_route_backward", backward=True)


def moe_route(logits: Tensor, top_k: int, scoring: str = "softmax", topk_first: bool = False,
              renormalize: bool = False, renormalize_eps: float = 0.0, bias: Tensor | None = None,
              n_group: int = 1, topk_group: int = 1, scaling: float = 1.0,
              keep_float: bool = False) -> tuple[Tensor, Tensor]:
    """(weights, indices) of the top ``top_k`` experts per row of ``logits`` (see the module's docstring
    for the variants). Calls ``torch.ops.python_native.moe_route``, so installed overrides serve it."""
    return OP(logits, top_k, scoring, topk_first, renormalize, renormalize_eps, bias, n_group, topk_group,
              scaling, keep_float)
