"""The rotary rule: a modeling module's ``apply_rotary_pos_emb`` to ``rotary``
(``python_native/ops/rotary_op.py``).

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
PRIORITY = 10  # a function rule: tried last, no module rule competes with it


# How a modeling module lays out the pairs it rotates, and the tables it is given.
LAYOUTS = {
    "half-split": "pairs (i, i + d/2), the tables as given",
    "half-width tables": "pairs (i, i + d/2), tables of d/2 angles (GPT-OSS)",
    "interleaved, split out": "pairs (2i, 2i + 1) from the tables' first half, returned half-split (DeepSeek)",
    "interleaved": "pairs (2i, 2i + 1) from the tables' first half, kept in place (GLM)",
}
# (head dim, table width, what the probe confirms): the full width, and a rotated part of the head dim.
SHAPES = {"half-width tables": ((8, 4, "full"),), None: ((8, 8, "full"), (12, 8, "partial"))}


@dataclasses.dataclass(frozen=True)
class RotaryPlan:
    extra: tuple[str, ...]  # the parameters after (q, k, cos, sin), in order
    defaults: tuple[tuple[str, Any], ...]
    dtypes: frozenset
    layout: str = "half-split"
    widths: frozenset = frozenset({"full"})  # "full": tables over the whole head dim; "partial": its first part

    def describe(self) -> str:
        only = "" if self.dtypes >= set(DTYPES) else "; " + (
            ", ".join(str(d).removeprefix("torch.") for d in DTYPES if d in self.dtypes) + " inputs only"
            if self.dtypes else "no input dtype confirmed")
        return (f"({', '.join(('q', 'k', 'cos', 'sin', *self.extra))}); {self.layout}; "
                f"tables over {_widths(self.widths)}{only}")


def _widths(widths: frozenset) -> str:
    return " or ".join(w for w, key in (("the full head dim", "full"), ("its first part", "partial")) if key in widths)


def _split(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs (x0, x1), (x2, x3)... to the half-split order rotary takes."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def _unsplit(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.stack((x[..., :half], x[..., half:]), dim=-1).flatten(-2)


def _tables(layout: str, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary's tables (the angle of each pair twice, half-split) from those the function takes."""
    if layout == "half-split":
        return cos, sin
    if layout != "half-width tables":
        cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def apply(layout: str, op: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
          sin: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a function of ``layout`` computes, through ``op`` (rotary): its pairs moved to the
    half-split order and back, the part of the head dim past the tables passed through."""
    cos, sin = _tables(layout, cos, sin)
    width = cos.shape[-1]
    qr, kr = (q, k) if width == q.shape[-1] else (q[..., :width], k[..., :width])
    if layout.startswith("interleaved"):
        qr, kr = _split(qr), _split(kr)
    qo, ko = op(qr, kr, cos, sin, dim)
    if layout == "interleaved":
        qo, ko = _unsplit(qo), _unsplit(ko)
    if width != q.shape[-1]:
        qo, ko = torch.cat((qo, q[..., width:]), dim=-1), torch.cat((ko, k[..., width:]), dim=-1)
    return qo, ko


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


def _probe(dtype: torch.dtype, layout_dim: int = 1, head: int = 8, width: int = 8) -> tuple[torch.Tensor, ...]:
    q = probe.randn(2, 4, 5, head, dtype=dtype, seed=1)
    k = probe.randn(2, 2, 5, head, dtype=dtype, seed=2)
    cos, sin = probe.randn(2, 5, width, dtype=dtype, seed=3), probe.randn(2, 5, width, dtype=dtype, seed=4)
    if layout_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    return q, k, cos, sin


def _reference(layout: str) -> Callable[..., Any]:
    return lambda q, k, cos, sin, dim=1: apply(layout, rotary_op.OP, q, k, cos, sin, dim)


def _confirmed(function: Callable[..., Any], layout: str, dtype: torch.dtype = torch.float32, dim: int = 1) -> frozenset:
    """The table widths (full, partial) for which ``layout`` computes what ``function`` does."""
    kwargs = {"unsqueeze_dim": dim} if dim != 1 else {}
    return frozenset(name for head, width, name in SHAPES.get(layout, SHAPES[None])
                     if probe.same(probe.attempt(function, *(p := _probe(dtype, dim, head, width)), **kwargs),
                                   probe.attempt(_reference(layout), *p, dim)))


def _rotates(function: Callable[..., Any]) -> bool:
    """Whether ``function`` returns a q-shaped and a k-shaped tensor for some probe shape."""
    for head, width, _ in (*SHAPES[None], *SHAPES["half-width tables"]):
        q, k, cos, sin = _probe(torch.float32, 1, head, width)
        got = probe.attempt(function, q, k, cos, sin)
        if isinstance(got, tuple) and len(got) == 2 and all(isinstance(g, torch.Tensor) for g in got) \
                and (got[0].shape, got[1].shape) == (q.shape, k.shape):
            return True
    return False


def _complex(function: Callable[..., Any]) -> LeftAlone | None:
    """A function of ``(q, k, freqs)`` that rotates by complex products (Llama 4): recognised, and
    left alone with what its probe found; None for any other function of three arguments."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if len(params) != 3 or any(p.default is not p.empty or p.kind is p.VAR_POSITIONAL for p in params):
        return None
    q, k = probe.randn(2, 5, 4, 8, seed=1), probe.randn(2, 5, 2, 8, seed=2)
    angles = probe.randn(2, 5, 4, seed=3)
    freqs = torch.polar(torch.ones_like(angles), angles)
    wanted = probe.attempt(function, q, k, freqs)
    cos, sin = torch.cat((freqs.real, freqs.real), -1), torch.cat((freqs.imag, freqs.imag), -1)
    ours = probe.attempt(_reference("interleaved"), q, k, cos, sin, 2)
    if not probe.close(wanted, ours):
        return None
    found = "the same bits on its probe" if probe.same(wanted, ours) else "other bits than rotary's real arithmetic"
    return LeftAlone(f"rotates q and k by complex products with a freqs_cis table ({found}): rotary takes real "
                     "cos/sin tables, and torch's complex multiply rounds by its own rule on some sizes")


def match_rotary(function: Callable[..., Any]) -> RotaryPlan | LeftAlone | None:
    signature = _signature(function)
    if signature is None:
        return _complex(function)
    extra, defaults = signature
    found = next(((layout, widths) for layout in LAYOUTS if (widths := _confirmed(function, layout))), None)
    if found is None:
        return _unmatched(function)
    layout, widths = found
    if "unsqueeze_dim" in defaults and not _confirmed(function, layout, dim=2):
        return LeftAlone("takes unsqueeze_dim but does not unsqueeze the tables as rotary does")
    dtypes = frozenset(dt for dt in DTYPES if _confirmed(function, layout, dt))
    return RotaryPlan(extra, tuple(defaults.items()), dtypes, layout, widths)


def _unmatched(function: Callable[..., Any]) -> LeftAlone | None:
    """Why a function that rotates q and k is left alone, or None for one that does not."""
    q, k, cos, sin = _probe(torch.float32)
    wanted = probe.attempt(function, q, k, cos, sin)
    if any(probe.close(wanted, probe.attempt(_reference(layout), q, k, cos, sin)) for layout in LAYOUTS):
        return LeftAlone("a rotary embedding computed in another order or precision: rotary would change its results")
    if _rotates(function):
        return LeftAlone("rotates q and k in a layout none of rotary's reproduces bit for bit ("
                         + "; ".join(LAYOUTS.values()) + ")")
    return None


def _shape_declined(plan: RotaryPlan, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> str | None:
    """Why a call's shapes are not those the probe confirmed (None when they are)."""
    width = cos.shape[-1] * (2 if plan.layout == "half-width tables" else 1)
    kind = "full" if width == q.shape[-1] else "partial" if width < q.shape[-1] else None
    if kind in plan.widths and q.dim() == cos.dim() + 1 and k.shape[-1] == q.shape[-1]:
        return None
    found = {"full": "tables over the full head dim", "partial": "tables over part of the head dim",
             None: "tables wider than the head dim"}[kind]
    return (f"q {tuple(q.shape)} with tables {tuple(cos.shape)}: {found}, where the probe confirmed "
            f"tables over {_widths(plan.widths)}")


def replace_rotary(function: Callable[..., Any], plan: RotaryPlan) -> Callable[..., Any]:
    names, defaults, dtypes, layout = plan.extra, dict(plan.defaults), plan.dtypes, plan.layout
    op = rotary_op.OP

    def rotary(q, k, cos, sin, *args, **kwargs):
        values = dict(defaults)
        values.update(zip(names, args, strict=False))
        values.update(kwargs)
        dim = values.pop("unsqueeze_dim", 1)
        why = None
        if len(args) > len(names) or set(kwargs) - set(names) or any(values[n] is not defaults[n] for n in values):
            why = "arguments other than unsqueeze_dim off their defaults"
        elif q.dtype not in dtypes or q.dtype != k.dtype or cos.dtype != q.dtype or not isinstance(dim, int):
            why = f"q {q.dtype}, k {k.dtype}, tables {cos.dtype}: dtypes the probe did not confirm"
        else:
            why = _shape_declined(plan, q, k, cos)
        if why is not None:
            runtime.declined("rotary", q, f"{why}: the function's own code ran")
            return function(q, k, cos, sin, *args, **kwargs)
        runtime.routing("rotary", q)
        return apply(layout, op, q, k, cos, sin, dim)

    return rotary


RULES = [PatchRule("rotary", match_rotary, replace_rotary, ops=("rotary",), target="function",
                   description="the rotary application function of each modeling module (apply_rotary_pos_emb)")]
