"""Check every installed override against aten on this machine, forward and backward.

Each override's op is driven through the public torch call that reaches it (``torch.softmax``
reaches ``aten::_softmax`` and, in backward, ``aten::_softmax_backward_data``) on OpInfo samples
where torch ships them plus a small catalogue of awkward inputs. Every sample runs three times: with
the overrides, with the override's DSL disabled (aten), and in float64 with it disabled (the
truth). The override passes when it is as close to aten as the dtype's default tolerance, or no
further from the truth than aten is (see ``mismatch``). An override that raises on an input its
cond accepted is a failure too: conds must decline what impls cannot do.

``torch.testing._internal.common_methods_invocations`` is slow to import, so it is imported only
when OpInfo samples are first asked for.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

import python_native as pn

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# torch.testing.assert_close defaults: (rtol, atol).
TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def mismatch(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, what: str, grad: bool = False) -> str | None:
    """Why ``got`` fails against aten's ``ref`` and the float64 ``truth``, or None when it passes.

    ``got`` passes where it is within the dtype's default tolerance of ``ref``, or no further from
    ``truth`` than ``ref`` is (plus that tolerance). The second clause admits results more accurate
    than aten's: its CPU kernels accumulate some half-precision reductions (layer norm's weight
    gradient, for one) in half precision. For half-precision gradients the absolute tolerance also
    scales with the largest gradient: they are sums of many rounded terms whose cancellation leaves
    small elements with errors of the terms' size, not of their own.
    """
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"{what}: {tuple(got.shape)}/{got.dtype} vs aten {tuple(ref.shape)}/{ref.dtype}"
    rtol, atol = TOLERANCES.get(got.dtype, (0.0, 0.0))
    g, r, t = got.double(), ref.double(), truth.double()
    if grad and got.dtype != torch.float32 and t.numel():
        atol += rtol * t.abs().nan_to_num(0.0, 0.0, 0.0).max().item()
    close = (g - r).abs() <= atol + rtol * r.abs()
    no_worse = (g - t).abs() <= (r - t).abs() + atol + rtol * t.abs()
    ok = close | no_worse | (g == r) | (g.isnan() & r.isnan())
    if bool(ok.all()):
        return None
    i = int((~ok).flatten().nonzero()[0])
    return (
        f"{what}: {int((~ok).sum())}/{ok.numel()} elements off; first at flat index {i}: "
        f"got {g.flatten()[i].item()}, aten {r.flatten()[i].item()}, float64 {t.flatten()[i].item()}"
    )


def max_error(x: torch.Tensor, truth: torch.Tensor) -> float:
    """Largest absolute difference from the float64 truth over the finite elements of both."""
    d = (x.double() - truth.double()).abs()
    d = d[torch.isfinite(x.double()) & torch.isfinite(truth.double())]
    return float(d.max()) if d.numel() else 0.0


# ----- samples -----

@dataclass
class Sample:
    """One call: ``fn(*inputs)``; ``source`` names where it came from (a catalogue case or OpInfo)."""

    source: str
    fn: Callable[..., torch.Tensor]
    inputs: Sequence[torch.Tensor]


def _rand(*shape: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, dtype=torch.float32, device=device) * scale).to(dtype)


def _rows(dtype: torch.dtype, device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The awkward 2-D inputs every row-wise op is checked on (the reduced dim is the last)."""
    yield "odd width", _rand(3, 37, dtype=dtype, device=device)
    yield "transposed", _rand(33, 4, dtype=dtype, device=device).t()
    yield "strided rows", _rand(4, 64, dtype=dtype, device=device)[:, ::2]
    yield "empty", _rand(0, 16, dtype=dtype, device=device)
    inf = _rand(3, 20, dtype=dtype, device=device)
    inf[0, :5] = float("-inf")
    inf[1, 7] = float("-inf")
    yield "-inf entries", inf
    yield "1e4 scale", _rand(2, 24, dtype=dtype, device=device, scale=1e4)


def _row_cases(make_fn: Callable[[torch.Tensor], tuple[Callable, list[torch.Tensor]]]):
    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        for name, x in _rows(dtype, device):
            fn, inputs = make_fn(x)
            yield Sample(name, fn, inputs)
    return cases


def _affine(x: torch.Tensor) -> list[torch.Tensor]:
    width = x.shape[-1]
    return [x, _rand(width, dtype=x.dtype, device=x.device.type), _rand(width, dtype=x.dtype, device=x.device.type)]


def _finite(make_fn):
    """Row cases without -inf inputs, for ops whose math is undefined there (norms of -inf rows)."""
    inner = _row_cases(make_fn)

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        return (s for s in inner(dtype, device) if s.source != "-inf entries")
    return cases


def _bmm_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    for name, (a_shape, b_shape) in {
        "outer product": ((3, 5, 1), (3, 1, 7)),
        "odd sizes": ((2, 17, 3), (2, 3, 9)),
        "empty batch": ((0, 4, 1), (0, 1, 4)),
    }.items():
        yield Sample(name, torch.bmm, [_rand(*a_shape, dtype=dtype, device=device), _rand(*b_shape, dtype=dtype, device=device)])
    a = _rand(2, 1, 6, dtype=dtype, device=device).transpose(1, 2)
    b = _rand(2, 5, 1, dtype=dtype, device=device).transpose(1, 2)
    yield Sample("transposed", torch.bmm, [a, b])
    yield Sample("1e4 scale", torch.bmm, [_rand(2, 4, 1, dtype=dtype, device=device, scale=100.0),
                                          _rand(2, 1, 4, dtype=dtype, device=device, scale=100.0)])


@dataclass(frozen=True)
class Driver:
    """How to reach an aten op from Python: its own cases and the OpInfo names whose samples hit it."""

    cases: Callable[[torch.dtype, str], Iterator[Sample]]
    opinfos: tuple[str, ...] = ()
    backward_ops: tuple[str, ...] = ()


DRIVERS: dict[str, Driver] = {
    "_softmax": Driver(_row_cases(lambda x: (lambda t: torch.softmax(t, -1), [x])),
                       ("softmax", "nn.functional.softmax"), ("_softmax_backward_data",)),
    "_log_softmax": Driver(_row_cases(lambda x: (lambda t: torch.log_softmax(t, -1), [x])),
                           ("log_softmax",), ("_log_softmax_backward_data",)),
    "native_layer_norm": Driver(_finite(lambda x: (lambda t, w, b: F.layer_norm(t, t.shape[-1:], w, b), _affine(x))),
                                ("nn.functional.layer_norm",), ("native_layer_norm_backward",)),
    "_fused_rms_norm": Driver(_finite(lambda x: (lambda t, w, _b: F.rms_norm(t, t.shape[-1:], w), _affine(x))),
                              ("nn.functional.rms_norm",), ("_fused_rms_norm_backward",)),
    "silu": Driver(_finite(lambda x: (F.silu, [x])), ("nn.functional.silu",), ("silu_backward",)),
    "gelu": Driver(_finite(lambda x: (lambda t: F.gelu(t, approximate="tanh"), [x])),
                   ("nn.functional.gelu",), ("gelu_backward",)),
    "bmm": Driver(_bmm_cases, ("bmm",), ("bmm",)),
}

FORWARD_OF = {b: fwd for fwd, d in DRIVERS.items() for b in d.backward_ops if b != fwd}


def opinfo_problem() -> str | None:
    """Why torch's OpInfo tables cannot be used here (they need ``expecttest``), or None."""
    try:
        import torch.testing._internal.common_methods_invocations  # noqa: F401
    except Exception as e:  # a torch install without its test tables or their dependencies
        return f"{type(e).__name__}: {e}"
    return None


def _opinfo_samples(names: Sequence[str], dtype: torch.dtype, device: str) -> Iterator[Sample]:
    """OpInfo samples of ``names``; none where torch's test tables are not importable."""
    if opinfo_problem() is not None:
        return
    from torch.testing._internal.common_methods_invocations import op_db
    for info in op_db:
        label = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if label not in names or dtype not in info.supported_dtypes(device):
            continue
        try:
            samples = list(info.sample_inputs(device, dtype, requires_grad=False))
        except Exception:
            continue
        for s in samples:
            if not isinstance(s.input, torch.Tensor):
                continue
            tensors = [s.input, *[a for a in s.args if isinstance(a, torch.Tensor)]]
            args = list(s.args)
            slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

            def fn(*ts, _op=info.op, _args=args, _slots=slots, _kw=s.kwargs):
                call = list(_args)
                for i, t in zip(_slots, ts[1:], strict=True):
                    call[i] = t
                return _op(ts[0], *call, **_kw)

            yield Sample(f"OpInfo {label}", fn, tensors)


def samples_for(op: str, dtype: torch.dtype, device: str, limit: int | None) -> list[Sample]:
    """At most ``limit`` samples, the catalogue's cases and OpInfo's taken in turn."""
    driver = DRIVERS[op]
    own = driver.cases(dtype, device)
    theirs = _opinfo_samples(driver.opinfos, dtype, device)
    merged = (s for pair in itertools.zip_longest(own, theirs) for s in pair if s is not None)
    return list(itertools.islice(merged, limit))


# ----- running -----

@dataclass
class _Run:
    out: torch.Tensor | None
    grads: list[torch.Tensor | None]
    fired: set[str]


def _leaf(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh leaf with ``t``'s values, sizes and strides (strided inputs stay strided)."""
    dtype = dtype or t.dtype
    copy = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=t.device)
    return copy.copy_(t.detach()).requires_grad_(t.is_floating_point())


def _first_tensor(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else next(o for o in out if isinstance(o, torch.Tensor))


def _run(sample: Sample, dsl: str, scope, wide: bool = False, grad_seed: int = 0) -> _Run:
    leaves = [_leaf(t, torch.float64 if wide else None) for t in sample.inputs]
    with scope, pn.trace() as trace:
        out = _first_tensor(sample.fn(*leaves))
        if out.requires_grad and out.numel():
            gen = torch.Generator().manual_seed(grad_seed)
            grad = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device, out.dtype)
            out.backward(grad)
    fired = {e.op for e in trace.events if e.dsl == dsl and e.outcome == "override"}
    return _Run(out.detach(), [t.grad for t in leaves], fired)


@dataclass
class Row:
    """One override checked at one dtype."""

    op: str
    dtype: str
    samples: int = 0
    fired: int = 0
    max_error: float = 0.0
    max_error_aten: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.failures:
            return "FAIL"
        return "ok" if self.fired else "not fired"


def _check_sample(sample: Sample, op: str, dsl: str, rows: dict[str, Row]) -> None:
    controller = getattr(pn, dsl)
    try:
        ref = _run(sample, dsl, controller.disabled())
        truth = _run(sample, dsl, controller.disabled(), wide=True)
    except Exception:  # aten itself rejects the sample: nothing to compare against
        return
    for row in rows.values():
        row.samples += 1
    try:
        got = _run(sample, dsl, contextlib.nullcontext())
    except Exception as e:
        for row in rows.values():
            row.failures.append(f"{sample.source}: raised on input its cond accepted: {type(e).__name__}: {e}")
        return
    for name, row in rows.items():
        if name not in got.fired:
            continue
        row.fired += 1
        pairs = [("output", got.out, ref.out, truth.out, False)] if name == op else []
        if name != op or name in DRIVERS[op].backward_ops:
            pairs += [(f"gradient {i}", g, r, t, True)
                      for i, (g, r, t) in enumerate(zip(got.grads, ref.grads, truth.grads, strict=True)) if r is not None]
        for what, g, r, t, is_grad in pairs:
            if g is None:
                row.failures.append(f"{sample.source}: {what} missing")
                continue
            row.max_error = max(row.max_error, max_error(g, t))
            row.max_error_aten = max(row.max_error_aten, max_error(r, t))
            why = mismatch(g, r, t, what, grad=is_grad)
            if why:
                row.failures.append(f"{sample.source}: {why}")


def _device_of(dispatch_key: str) -> str:
    return "cuda" if dispatch_key.lower() in ("cuda", "autogradcuda") else "cpu"


def _why_not_here(o) -> str | None:
    """Why an installed override cannot be exercised on this machine (None: it can)."""
    if not o.active:
        return "inactive: switched off, or its DSL cannot run here"
    if _device_of(o.dispatch_key) == "cuda" and not torch.cuda.is_available():
        return f"installed at {o.dispatch_key}, and this machine has no CUDA device"
    return None


def verify(op: str | None = None, max_samples: int | None = 8, dtypes: Sequence[torch.dtype] = DTYPES) -> dict:
    """Check the installed overrides (only ``op``'s and its backward's when given); returns the report."""
    overrides = [o for o in pn.overrides() if o.derived_from is None]
    if op is not None:
        overrides = [o for o in overrides if o.op == op or FORWARD_OF.get(o.op) == op]
        if not overrides:
            installed = sorted({o.op for o in pn.overrides()})
            raise ValueError(f"no installed override for op {op!r}; installed: {', '.join(installed) or 'none'}")
    groups: dict[tuple[str, str, str], list[str]] = {}
    unchecked: list[str] = []
    skipped: dict[str, str] = {}
    for o in overrides:
        forward = FORWARD_OF.get(o.op, o.op)
        why_not = _why_not_here(o)
        if why_not is not None:
            skipped[o.op] = why_not
            continue
        if forward not in DRIVERS:
            unchecked.append(o.op)
            continue
        names = groups.setdefault((forward, o.dsl, o.dispatch_key), [])
        if o.op not in names:
            names.append(o.op)
    rows: list[Row] = []
    for (forward, dsl, key), names in groups.items():
        device = _device_of(key)
        for dtype in dtypes:
            by_name = {name: Row(name, str(dtype).removeprefix("torch.")) for name in names}
            torch.manual_seed(0)
            for sample in samples_for(forward, dtype, device, max_samples):
                _check_sample(sample, forward, dsl, by_name)
            rows.extend(by_name.values())
    fired = {r.op for r in rows if r.fired}
    checked = sorted({o.op for o in overrides if o.op not in skipped and o.op not in unchecked})
    coverage = {name: name in fired for name in checked}
    ok = all(not r.failures for r in rows) and all(coverage.values())
    return {
        "ok": ok,
        "rows": [{**asdict(r), "status": r.status} for r in rows],
        "opinfo": opinfo_problem() or "used",
        "coverage": {"installed": len(checked), "covered": sum(coverage.values()), "ops": coverage,
                     "unchecked": sorted(unchecked), "skipped": skipped},
    }


def render(report: dict) -> str:
    header = ("op", "dtype", "samples", "fired", "max err ours", "max err aten", "status")
    lines = [[r["op"], r["dtype"], str(r["samples"]), str(r["fired"]), f"{r['max_error']:.3g}",
              f"{r['max_error_aten']:.3g}", r["status"]] for r in report["rows"]]
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=True)]
    out = ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [header, *lines]]
    for r in report["rows"]:
        out += [f"  {r['op']} {r['dtype']}: {f}" for f in r["failures"][:5]]
    cov = report["coverage"]
    out.append(f"coverage: {cov['covered']}/{cov['installed']} overrides fired"
               + (f"; never fired: {', '.join(k for k, v in cov['ops'].items() if not v)}"
                  if cov["covered"] < cov["installed"] else ""))
    out += [f"not checked here: {name} ({why})" for name, why in cov.get("skipped", {}).items()]
    if cov.get("unchecked"):
        out.append(f"no samples to check with (not verified): {', '.join(cov['unchecked'])}")
    if report["opinfo"] != "used":
        out.append(f"OpInfo samples unavailable ({report['opinfo']}); pip install expecttest to add them")
    out.append("all overrides match aten" if report["ok"] else "MISMATCH: see above")
    return "\n".join(out)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2)
