"""The edge-case grid: every overridden op against aten on the inputs that break kernels.

Every op of the Triton library, through torch's public API, on empty, stride-0, transposed,
channels-last, NaN/inf and very wide (65,537 columns) inputs, in each float dtype (float64 too:
the overrides decline it, and that must be invisible), as a plain call with its backward, with
mixed ``requires_grad``, and through the one ``out=`` form an override serves (layer norm's: aten's
``out=`` wrapper calls the functional op). Each case runs with the overrides on and off
(``pn.triton.disabled()``); values (within ``verify``'s dtype tolerances, against the float64 truth
as well), dtypes, shapes, strides, which gradients exist and the types of errors must agree, and
the trace must show each routed op served by its Triton override, or declined with the reason the
overrides give for that input (``Op.expected``): a case aten serves on both sides proves nothing.
The ``out=`` and in-place forms of the other ops have no override, so they are not in the grid.

Specials sit at the start of their rows: where aten's own layer norm finds the mean of a row
holding inf depends on where in its vector lanes the inf falls (NaN almost everywhere, inf for the
last lane), and NaN is the only answer that does not.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DEVICE, assert_routed, elementwise_contract, requires_triton

import python_native as pn
from python_native.tools import verify

pytestmark = [requires_triton, pytest.mark.override, pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")]

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
WIDE = 65_537
Tensor = torch.Tensor


# ----- inputs -----


def _rows(layout: str, g: torch.Generator, rows: int = 4, cols: int = 24) -> Tensor:
    """A ``rows x cols`` float32 matrix (or 4-D for channels-last) in ``layout``."""
    if layout == "contiguous":
        return torch.randn(rows, cols, generator=g)
    if layout == "empty_rows":
        return torch.randn(0, cols, generator=g)
    if layout == "empty_cols":
        return torch.randn(rows, 0, generator=g)
    if layout == "stride0":
        return torch.randn(1, cols, generator=g).expand(rows, cols)
    if layout == "transposed":
        return torch.randn(cols, rows, generator=g).t()
    if layout == "channels_last":
        return torch.randn(2, 6, 3, 4, generator=g).contiguous(memory_format=torch.channels_last)
    if layout == "specials":
        x = torch.randn(rows + 1, cols, generator=g)
        x[0, 0], x[1, 0], x[2, 0] = float("inf"), float("-inf"), float("nan")
        x[3, :] = float("-inf")
        x[4, :2] = torch.tensor([float("inf"), float("-inf")])
        return x
    if layout == "wide":
        return torch.randn(1, WIDE, generator=g)
    raise AssertionError(layout)


ROW_LAYOUTS = ("contiguous", "empty_rows", "empty_cols", "stride0", "transposed", "channels_last", "specials", "wide")


def _on_device(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` on the kernels' device, with ``t``'s strides (an expanded view stays one)."""
    if t.numel() and 0 in t.stride():
        base = t[tuple(slice(0, 1) if s == 0 else slice(None) for s in t.stride())]
        return base.to(DEVICE, dtype).expand(t.shape)
    out = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=DEVICE)
    return out.copy_(t)


# ----- ops: each maps (inputs) to the tensors it produces, forward and backward -----


@dataclass(frozen=True)
class Op:
    name: str
    forward: Callable[..., Tensor]
    make: Callable[[str, torch.Generator], list[Tensor]]  # float32 inputs for a layout
    layouts: tuple[str, ...] = ROW_LAYOUTS
    # Wide rows take the interpreter seconds per call; where the wide path costs most (the layer
    # norm backward's column strips, the outer product's tiles) the half dtypes stay narrow: their
    # casts are the same code at every width.
    wide_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    elementwise: bool = False  # special values checked against the op's contract (``elementwise_contract``)
    routed: tuple[str, ...] = ()  # the aten ops a call routes, forward then backward
    declines: dict[str, dict[str, str]] = field(default_factory=dict)  # layout -> {op: the reason's words}

    def expected(self, layout: str, dtype: torch.dtype) -> dict[str, str | None]:
        """Per routed op, None where a Triton override serves it, else the words of its decline."""
        if dtype == torch.float64:
            return dict.fromkeys(self.routed, FLOAT64)
        reasons = self.declines.get(layout, {})
        return {op: reasons.get(op) for op in self.routed}

    def reference(self, layout: str, dtype: torch.dtype) -> Callable[..., Tensor]:
        """aten's forward as the reference: an elementwise op's specials per its contract, in the dtypes
        the kernels serve (float64 is declined, so aten's own path is on both sides)."""
        contract = self.elementwise and layout == "specials" and dtype != torch.float64
        return elementwise_contract(self.forward) if contract else self.forward


def _softmax_dim(x: Tensor) -> int:
    return 1 if x.ndim == 4 else -1  # the channels of a channels-last tensor: stride 1


def _ln_shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape[-1:]) if x.ndim == 2 else tuple(x.shape[1:])


def _ln_params(x: Tensor) -> list[Tensor]:
    n = _ln_shape(x)
    return [torch.rand(n) + 0.5, torch.randn(n)]


NARROW_HALF = (torch.float32, torch.float64)

# The words of the overrides' declines (``Op.declines``), as a trace's reasons give them.
FLOAT64 = "dtype float64"
EMPTY = "empty input"


def _row_op(routed: tuple[str, ...], not_rows: str, **declines: dict[str, str]) -> dict:
    """``routed`` and ``declines`` of a row op: empty inputs and channels-last rows declined (``not_rows``)."""
    every = {"empty_rows": EMPTY, "empty_cols": EMPTY, "channels_last": not_rows}
    return {"routed": routed, "declines": {lay: dict.fromkeys(routed, why) for lay, why in every.items()} | declines}


def _elementwise_op(routed: tuple[str, ...]) -> dict:
    return {"routed": routed, "declines": {lay: dict.fromkeys(routed, EMPTY) for lay in ("empty_rows", "empty_cols")},
            "elementwise": True}


SOFTMAX = _row_op(("_softmax", "_softmax_backward_data"), "is not the last dim")
LOG_SOFTMAX = _row_op(("_log_softmax", "_log_softmax_backward_data"), "is not the last dim")
# Rows wider than the forward's register tile: the forward declines, the streamed backward serves.
LAYER_NORM = _row_op(("native_layer_norm", "native_layer_norm_backward"), "the rows do not form one strided row axis",
                     wide={"native_layer_norm": "exceed the kernel's"})
# The backward's bmms multiply by the other operand, an inner dim K > 1: aten's.
BMM = {"routed": ("bmm",), "declines": {"empty_rows": {"bmm": "empty or mismatched batches"},
                                        "inner_dim_2": {"bmm": "not an outer product"}}}

OPS = {
    "softmax": Op("softmax", lambda x: F.softmax(x, _softmax_dim(x)), lambda lay, g: [_rows(lay, g)], **SOFTMAX),
    "log_softmax": Op("log_softmax", lambda x: F.log_softmax(x, _softmax_dim(x)), lambda lay, g: [_rows(lay, g)],
                      **LOG_SOFTMAX),
    "layer_norm": Op("layer_norm", lambda x, w, b: F.layer_norm(x, _ln_shape(x), w, b, 1e-5),
                     lambda lay, g: [x := _rows(lay, g), *_ln_params(x)], wide_dtypes=NARROW_HALF, **LAYER_NORM),
    # The statistics too: the mean of a row holding inf is NaN, as aten's.
    "native_layer_norm": Op("native_layer_norm", lambda x, w, b: torch.native_layer_norm(x, _ln_shape(x), w, b, 1e-5),
                            lambda lay, g: [x := _rows(lay, g), *_ln_params(x)], wide_dtypes=NARROW_HALF,
                            **LAYER_NORM),
    "layer_norm_bare": Op("layer_norm_bare", lambda x: F.layer_norm(x, _ln_shape(x)), lambda lay, g: [_rows(lay, g)],
                          wide_dtypes=NARROW_HALF, **LAYER_NORM),
    "gelu": Op("gelu", F.gelu, lambda lay, g: [_rows(lay, g) * 3], **_elementwise_op(("gelu", "gelu_backward"))),
    "gelu_tanh": Op("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda lay, g: [_rows(lay, g) * 3],
                    **_elementwise_op(("gelu", "gelu_backward"))),
    "silu": Op("silu", F.silu, lambda lay, g: [_rows(lay, g) * 3], **_elementwise_op(("silu", "silu_backward"))),
    "bmm": Op("bmm", torch.bmm, lambda lay, g: _bmm_inputs(lay, g),
              ("contiguous", "empty_rows", "stride0", "transposed", "specials", "wide", "inner_dim_2"), NARROW_HALF,
              **BMM),
}


def _bmm_inputs(layout: str, g: torch.Generator) -> list[Tensor]:
    if layout == "contiguous":
        return [torch.randn(2, 3, 1, generator=g), torch.randn(2, 1, 5, generator=g)]
    if layout == "empty_rows":
        return [torch.randn(0, 3, 1, generator=g), torch.randn(0, 1, 5, generator=g)]
    if layout == "stride0":
        return [torch.randn(1, 3, 1, generator=g).expand(2, 3, 1), torch.randn(2, 1, 5, generator=g)]
    if layout == "transposed":
        return [torch.randn(2, 1, 3, generator=g).transpose(1, 2), torch.randn(5, 1, 2, generator=g).permute(2, 1, 0)]
    if layout == "specials":
        a, b = torch.randn(2, 3, 1, generator=g), torch.randn(2, 1, 5, generator=g)
        a[0, 0, 0], a[1, 2, 0], b[1, 0, 3] = float("inf"), float("nan"), float("-inf")
        return [a, b]
    if layout == "wide":
        return [torch.randn(1, 1, 1, generator=g), torch.randn(1, 1, WIDE, generator=g)]
    if layout == "inner_dim_2":  # not an outer product: aten's
        return [torch.randn(2, 3, 2, generator=g), torch.randn(2, 2, 5, generator=g)]
    raise AssertionError(layout)


# ----- running a case -----


@dataclass
class Outcome:
    tensors: list[Tensor | None] | None  # outputs, then gradients (None: no gradient)
    error: type | None = None
    events: list = field(default_factory=list)  # the trace's

    @property
    def fired(self) -> bool:
        return any(e.dsl == "triton" and e.outcome == "override" for e in self.events)


def _seed(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def _run(body: Callable[[], list[Tensor | None]], scope) -> Outcome:
    with scope, pn.trace() as t:
        try:
            tensors = body()
        except Exception as e:  # noqa: BLE001 - the error type is compared with aten's
            return Outcome(None, type(e), t.events)
    return Outcome([None if v is None else v.detach() for v in tensors], events=t.events)


def _functional(forward: Callable[..., Tensor], inputs: list[Tensor], grads: tuple[bool, ...],
                grad_seed: int) -> Callable[[], list]:
    def body() -> list[Tensor | None]:
        leaves = [t.detach().requires_grad_(wants) for t, wants in zip(inputs, grads, strict=True)]
        outs = forward(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        out = outs[0]
        if out.requires_grad:
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.dtype)
            out.backward(torch.empty_like(out).copy_(g))  # in the output's layout, as autograd hands it
        return [*outs, *(t.grad for t in leaves)]

    return body


def _compare(got: Outcome, ref: Outcome, truth: Outcome | None, what: str, n_outputs: int = 1) -> None:
    assert (got.error, ref.error) == (ref.error, ref.error), f"{what}: error {got.error} vs aten {ref.error}"
    if ref.error is not None:
        return
    assert len(got.tensors) == len(ref.tensors)
    for i, (g, r) in enumerate(zip(got.tensors, ref.tensors, strict=True)):
        label = f"{what}, result {i}"
        assert (g is None) == (r is None), f"{label}: {g} vs aten {r}"
        if r is None:
            continue
        assert (g.dtype, g.shape) == (r.dtype, r.shape), f"{label}: {g.dtype}{tuple(g.shape)} vs aten {r.dtype}{tuple(r.shape)}"
        assert _strides(g) == _strides(r), f"{label}: strides {g.stride()} vs aten {r.stride()}"
        t = truth.tensors[i] if truth is not None and truth.tensors is not None else r
        why = verify.mismatch(g, r, t.to(r.dtype) if t.dtype != torch.float64 else t, label, grad=i >= n_outputs)
        assert why is None, why


def _strides(t: Tensor) -> tuple[int, ...]:
    """The strides that mean something: those of dims longer than 1."""
    return tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)


def _check(op: Op, layout: str, dtype: torch.dtype, grads: tuple[bool, ...], label: str) -> None:
    inputs = [_on_device(t, dtype) for t in op.make(layout, _seed(op.name, layout))]
    wide_inputs = [_on_device(t, torch.float64) for t in inputs]  # the truth sees the same (rounded) values
    seed = zlib.crc32(label.encode())
    got = _run(_functional(op.forward, inputs, grads, seed), pn.trace())
    ref = _run(_functional(op.reference(layout, dtype), inputs, grads, seed), pn.triton.disabled())
    truth = _run(_functional(op.reference(layout, dtype), wide_inputs, grads, seed), pn.triton.disabled())
    assert not ref.fired and not truth.fired
    assert_routed(got.events, op.expected(layout, dtype), label)
    _compare(got, ref, truth, label, len(got.tensors or ()) - len(inputs))


CASES = [
    (name, layout, dtype)
    for name, op in OPS.items()
    for layout in op.layouts
    for dtype in (op.wide_dtypes if layout == "wide" else DTYPES)
]


@pytest.mark.parametrize("name, layout, dtype", CASES, ids=[f"{n}-{lay}-{str(d)[6:]}" for n, lay, d in CASES])
def test_plain_call_and_backward(name, layout, dtype):
    op = OPS[name]
    n_inputs = len(op.make("contiguous", _seed(0)))
    _check(op, layout, dtype, (True,) * n_inputs, f"{name} {layout} {dtype}")


# ----- mixed requires_grad -----

MIXED = [
    ("layer_norm", (True, False, True)), ("layer_norm", (False, True, False)), ("layer_norm", (False, False, True)),
    ("bmm", (True, False)), ("bmm", (False, True)),
]
MIXED_CASES = [(name, grads, layout, dtype) for name, grads in MIXED for layout in ("contiguous", "transposed")
               for dtype in DTYPES]


@pytest.mark.parametrize("name, grads, layout, dtype", MIXED_CASES,
                         ids=[f"{n}-{''.join('TF'[not g] for g in gs)}-{lay}-{str(d)[6:]}" for n, gs, lay, d in MIXED_CASES])
def test_mixed_requires_grad(name, grads, layout, dtype):
    _check(OPS[name], layout, dtype, grads, f"{name} grads={grads} {layout} {dtype}")


# ----- out= -----

# The one out= form an override serves: aten's out= wrapper of native_layer_norm calls the functional
# op, which routes. The others (softmax, gelu, silu, bmm, ...) and the in-place activations have no
# override (see the user guide's list of what aten keeps), so they are not in the grid.
OUT_OPS: dict[str, Callable[..., tuple[Tensor, ...]]] = {
    "layer_norm": lambda x, w, b, out: torch.ops.aten.native_layer_norm.out(
        x, (x.shape[-1],), w, b, 1e-5, out0=out[0], out1=out[1], out2=out[2]),
}
OUT_ROUTED = {"layer_norm": ("native_layer_norm",)}
OUT_KINDS = ("empty", "sized", "transposed", "wrong_dtype")


def _out_tensors(name: str, inputs: list[Tensor], kind: str) -> list[Tensor]:
    x = inputs[0]
    shapes = [tuple(x.shape), (x.shape[0], 1), (x.shape[0], 1)]
    dtype = x.dtype if kind != "wrong_dtype" else (torch.float32 if x.dtype == torch.float64 else torch.float64)
    if kind == "empty":
        return [torch.empty(0, dtype=dtype, device=DEVICE) for _ in shapes]
    if kind == "transposed":
        return [torch.empty(tuple(reversed(s)), dtype=dtype, device=DEVICE).permute(*reversed(range(len(s))))
                for s in shapes]
    return [torch.empty(s, dtype=dtype, device=DEVICE) for s in shapes]


OUT_CASES = [(name, kind, layout, dtype) for name in OUT_OPS for kind in OUT_KINDS
             for layout in ("contiguous", "specials") for dtype in DTYPES]


@pytest.mark.parametrize("name, kind, layout, dtype", OUT_CASES,
                         ids=[f"{n}-{k}-{lay}-{str(d)[6:]}" for n, k, lay, d in OUT_CASES])
def test_out_forms(name, kind, layout, dtype):
    inputs = [_on_device(t, dtype) for t in OPS[name].make(layout, _seed(name, layout))]

    def body() -> list[Tensor]:
        outs = _out_tensors(name, inputs, kind)
        got = OUT_OPS[name](*inputs, outs)
        got = got if isinstance(got, tuple) else (got,)
        same = [torch.tensor(g is o) for g, o in zip(got, outs, strict=True)]
        return [*outs, *same]

    label = f"{name} out={kind} {layout} {dtype}"
    got, ref = _run(body, pn.trace()), _run(body, pn.triton.disabled())
    assert not ref.fired
    why = FLOAT64 if dtype == torch.float64 else None
    assert_routed(got.events, dict.fromkeys(OUT_ROUTED[name], why), label)  # the error of a wrong dtype comes after
    _compare(got, ref, None, label)


# ----- the edge values found wrong once, named -----

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES[:3], ids=lambda d: str(d)[6:])
def test_gelu_of_infinities_and_nan_is_aten_s(approximate, dtype):
    values = [INF, -INF, NAN, 0.0, -0.0, 1e4, -1e4, 30.0, -30.0, 5.0, -5.0]
    x = torch.tensor(values, device=DEVICE).to(dtype)
    grad = torch.linspace(-1, 1, len(values), device=DEVICE).to(dtype)

    def gelu(t: Tensor) -> Tensor:
        return F.gelu(t, approximate=approximate)

    def run(scope, forward: Callable[[Tensor], Tensor]):
        leaf = x.clone().requires_grad_()
        with scope, pn.trace() as t:
            y = forward(leaf)
            y.backward(grad)
        return y.detach(), leaf.grad, t.ops("override")

    y, g, fired = run(pn.trace(), gelu)
    y_ref, g_ref, _ = run(pn.triton.disabled(), elementwise_contract(gelu))
    assert fired == ["gelu", "gelu_backward"]
    torch.testing.assert_close(y, y_ref, equal_nan=True)
    torch.testing.assert_close(g, g_ref, equal_nan=True)
    assert y[0].isinf() and y[0] > 0 and y[1].isnan() and y[2].isnan()  # aten: gelu(inf) = inf, gelu(-inf) = NaN


def test_layer_norm_mean_of_rows_holding_inf_is_nan_as_aten_s():
    x = torch.randn(4, 40, device=DEVICE)
    x[0, 0], x[1, 5], x[2, 0], x[2, 1] = INF, -INF, INF, -INF
    with pn.trace() as t:
        y, mean, rstd = torch.native_layer_norm(x, (40,), None, None, 1e-5)
    with pn.triton.disabled():
        y_ref, mean_ref, rstd_ref = torch.native_layer_norm(x, (40,), None, None, 1e-5)
    assert t.ops("override") == ["native_layer_norm"]
    assert mean[:3].isnan().all() and mean_ref[:3].isnan().all()
    for got, ref in ((y, y_ref), (mean, mean_ref), (rstd, rstd_ref)):
        torch.testing.assert_close(got, ref, equal_nan=True)
