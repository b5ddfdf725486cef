"""The rotary rule: a modeling module's ``apply_rotary_pos_emb`` to ``rotary``.

A function rule: it sees each module-level Python function an attention forward calls by a global
name. A candidate takes ``(q, k, cos, sin)`` first, its further parameters having defaults. The
probe calls it on random q and k (with unlike head counts, as grouped-query attention has) and
cos/sin tables, and it must return exactly what ``rotary``'s reference does, for each input dtype
routed, and for ``unsqueeze_dim=2`` where it takes that parameter. At run time a call is routed
when its arguments are what the probe confirmed (full-width tables, a dtype probed, no argument
other than ``unsqueeze_dim`` off its default); the function's own code runs otherwise.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch

from python_native.ops import rotary_op
from python_native.patching import probe, runtime
from python_native.patching.rules import LeftAlone, PatchRule

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class RotaryPlan:
    extra: tuple[str, ...]  # the parameters after (q, k, cos, sin), in order
    defaults: tuple[tuple[str, Any], ...]
    dtypes: frozenset

    def describe(self) -> str:
        return f"({', '.join(('q', 'k', 'cos', 'sin', *self.extra))})"


def _signature(function: Callable[..., Any]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) < 4 or any(p.kind not in positional or p.default is not p.empty for p in params[:4]):
        return None
    rest = params[4:]
    if any(p.default is p.empty or p.kind not in (*positional, inspect.Parameter.KEYWORD_ONLY) for p in rest):
        return None
    return tuple(p.name for p in rest), {p.name: p.default for p in rest}


def _probe(dtype: torch.dtype, layout_dim: int = 1) -> tuple[torch.Tensor, ...]:
    q = probe.randn(2, 4, 5, 8, dtype=dtype, seed=1)
    k = probe.randn(2, 2, 5, 8, dtype=dtype, seed=2)
    cos, sin = probe.randn(2, 5, 8, dtype=dtype, seed=3), probe.randn(2, 5, 8, dtype=dtype, seed=4)
    if layout_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    return q, k, cos, sin


def match_rotary(function: Callable[..., Any]) -> RotaryPlan | LeftAlone | None:
    signature = _signature(function)
    if signature is None:
        return None
    extra, defaults = signature
    q, k, cos, sin = _probe(torch.float32)
    wanted = probe.attempt(function, q, k, cos, sin)
    if not isinstance(wanted, tuple) or len(wanted) != 2:
        return None
    if not probe.same(wanted, rotary_op.OP(q, k, cos, sin, 1)):
        if probe.close(wanted, rotary_op.OP(q, k, cos, sin, 1)):
            return LeftAlone("a rotary embedding computed in another order or precision: rotary would change its results")
        if all(isinstance(w, torch.Tensor) for w in wanted) and (wanted[0].shape, wanted[1].shape) == (q.shape, k.shape):
            return LeftAlone("rotates q and k another way than rotary (interleaved pairs, part of the head dim, "
                             "or tables laid out otherwise): rotary would change its results")
        return None
    if "unsqueeze_dim" in defaults:
        qt, kt, cos, sin = _probe(torch.float32, 2)
        if not probe.same(probe.attempt(function, qt, kt, cos, sin, unsqueeze_dim=2), rotary_op.OP(qt, kt, cos, sin, 2)):
            return LeftAlone("takes unsqueeze_dim but does not unsqueeze the tables as rotary does")
    dtypes = frozenset(dt for dt in DTYPES
                       if probe.same(probe.attempt(function, *_probe(dt)), probe.attempt(rotary_op.OP, *_probe(dt), 1)))
    return RotaryPlan(extra, tuple(defaults.items()), dtypes)


def replace_rotary(function: Callable[..., Any], plan: RotaryPlan) -> Callable[..., Any]:
    names, defaults, dtypes = plan.extra, dict(plan.defaults), plan.dtypes
    op = rotary_op.OP

    def rotary(q, k, cos, sin, *args, **kwargs):
        values = dict(defaults)
        values.update(zip(names, args, strict=False))
        values.update(kwargs)
        dim = values.pop("unsqueeze_dim", 1)
        if (len(args) > len(names) or set(kwargs) - set(names) or any(values[n] is not defaults[n] for n in values)
                or q.dtype not in dtypes or q.dtype != k.dtype or cos.dtype != q.dtype
                or cos.shape[-1] != q.shape[-1] or q.dim() != cos.dim() + 1 or not isinstance(dim, int)):
            runtime.declined("rotary", q, "arguments the probe did not confirm (dtype, table width, extra "
                             "arguments): the function's own code ran")
            return function(q, k, cos, sin, *args, **kwargs)
        runtime.routing("rotary", q)
        return op(q, k, cos, sin, dim)

    return rotary


RULES = [PatchRule("rotary", match_rotary, replace_rotary, ops=("rotary",), target="function",
                   description="the rotary application function of each modeling module (apply_rotary_pos_emb)")]
