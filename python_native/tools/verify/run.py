"""Run every installed override against aten on this machine, forward and backward."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

import python_native as pn
from python_native.foundations import env, public_names
from python_native.panel import snapshot
from python_native.tools.verify.compare import max_error, max_rel_error, mismatch
from python_native.tools.verify.drivers import DRIVERS, FORWARD_OF
from python_native.tools.verify.samples import Sample, opinfo_problem, samples_for

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class _Run:
    out: torch.Tensor | None
    grads: list[torch.Tensor | None]
    fired: set[str]
    grad_out: torch.Tensor | None = None  # the gradient the output was given


def _leaf(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh leaf with ``t``'s values, sizes and strides (strided inputs stay strided); ``dtype``
    applies to floating tensors only (indices stay integers in the float64 run)."""
    dtype = dtype if dtype is not None and t.is_floating_point() else t.dtype
    copy = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=t.device)
    return copy.copy_(t.detach()).requires_grad_(t.is_floating_point())


def _first_tensor(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else next(o for o in out if isinstance(o, torch.Tensor))


def _run(sample: Sample, dsl: str, scope, wide: bool = False, grad_seed: int = 0) -> _Run:
    leaves = [_leaf(t, torch.float64 if wide else None) for t in sample.inputs]
    grad = None
    with scope, pn.trace() as trace:
        out = _first_tensor(sample.fn(*leaves))
        if out.requires_grad and out.numel():
            gen = torch.Generator().manual_seed(grad_seed)
            grad = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device, out.dtype)
            out.backward(grad)
    fired = {e.op for e in trace.events if e.dsl == dsl and e.outcome == "override"}
    return _Run(out.detach(), [t.grad for t in leaves], fired, grad)


@dataclass
class Row:
    """One override checked at one dtype."""

    op: str
    dtype: str
    samples: int = 0
    fired: int = 0
    max_error: float = 0.0
    max_error_aten: float = 0.0
    max_rel_error: float = 0.0  # max_error over the largest magnitude of the float64 result
    max_rel_error_aten: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.failures:
            return "FAIL"
        return "ok" if self.fired else "not fired"


def _check_sample(sample: Sample, op: str, dsl: str, rows: dict[str, Row], variant: str = "default") -> None:
    controller = getattr(pn, dsl)
    try:
        ref = _run(sample, dsl, controller.disabled())
        truth = _run(sample, dsl, controller.disabled(), wide=True)
    except Exception:  # aten itself rejects the sample: nothing to compare against
        return
    for row in rows.values():
        row.samples += 1
    try:
        scope = contextlib.nullcontext() if variant == "default" else pn.override_variant(op, variant)
        got = _run(sample, dsl, scope)
    except Exception as e:
        for row in rows.values():
            row.failures.append(f"{sample.source}: raised on input its cond accepted: {type(e).__name__}: {e}")
        return
    check = DRIVERS[op].check
    problems = check(sample, got, ref) if check is not None else []
    for name, row in rows.items():
        if name not in got.fired:
            continue
        row.fired += 1
        if check is not None:  # random results: judged by structure, not values
            row.failures += [f"{sample.source}: {p}" for p in problems]
            continue
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
            row.max_rel_error = max(row.max_rel_error, max_rel_error(g, t))
            row.max_rel_error_aten = max(row.max_rel_error_aten, max_rel_error(r, t))
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


def verify(op: str | Sequence[str] | None = None, max_samples: int | None = 8,
           dtypes: Sequence[torch.dtype] = DTYPES) -> dict:
    """Check the installed overrides (only ``op``'s and its backward's when given: one name or
    several, public or aten, as the panel's switches take them); returns the report."""
    overrides = [o for o in pn.overrides() if o.derived_from is None]
    if op is not None:  # a name, qualified or bare (``sum`` names ``sum.dim_IntList``), and the backward of it
        wanted = {name for given in ([op] if isinstance(op, str) else op)
                  for name in (given, *public_names.covered(given))}
        overrides = [o for o in overrides if wanted & {o.op, o.op.partition(".")[0], FORWARD_OF.get(o.op)}]
        if not overrides:
            installed = sorted({o.op for o in pn.overrides()})
            hint = snapshot.interpreter_hint()
            raise ValueError(f"no installed override for op {op!r}; installed: {', '.join(installed) or 'none'}"
                             + (f" ({hint})" if hint else ""))
    groups: dict[tuple[str, str, str], list[str]] = {}
    variants: dict[tuple[str, str, str], dict[str, None]] = {}  # every variant of each group's overrides
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
        variants.setdefault((forward, o.dsl, o.dispatch_key), {}).update(dict.fromkeys(o.variants))
    rows: list[Row] = []
    for (forward, dsl, key), names in groups.items():
        device = _device_of(key)
        for variant in variants[(forward, dsl, key)]:  # every variant: "default" first, each a row per op
            suffix = "" if variant == "default" else f" [{variant}]"
            for dtype in dtypes:
                by_name = {name: Row(name + suffix, str(dtype).removeprefix("torch.")) for name in names}
                torch.manual_seed(0)
                for sample in samples_for(DRIVERS[forward], dtype, device, max_samples):
                    _check_sample(sample, forward, dsl, by_name, variant)
                rows.extend(by_name.values())
    fired = {r.op for r in rows if r.fired}
    checked = sorted({o.op for o in overrides if o.op not in skipped and o.op not in unchecked})
    coverage = {name: name in fired for name in checked}
    problem = None
    if not checked:
        hint = snapshot.interpreter_hint()
        problem = ("nothing to check: no installed override can run on this machine"
                   + (f"; {hint}: {env.TRITON_INTERPRET[0]}=1 python -m python_native verify" if hint else ""))
    ok = problem is None and all(not r.failures for r in rows) and all(coverage.values())
    return {
        "ok": ok,
        "problem": problem,
        "rows": [{**asdict(r), "status": r.status} for r in rows],
        "opinfo": opinfo_problem() or "used",
        "coverage": {"installed": len(checked), "covered": sum(coverage.values()), "ops": coverage,
                     "unchecked": sorted(unchecked), "skipped": skipped},
    }


def render(report: dict) -> str:
    header = ("op", "dtype", "samples", "fired", "max err ours", "rel", "max err aten", "rel", "status")
    lines = [[r["op"], r["dtype"], str(r["samples"]), str(r["fired"]), f"{r['max_error']:.3g}",
              f"{r['max_rel_error']:.2g}", f"{r['max_error_aten']:.3g}", f"{r['max_rel_error_aten']:.2g}",
              r["status"]] for r in report["rows"]]
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=True)]
    out = ["  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [header, *lines]]
    if not lines:
        out = ["no override checked"]
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
    if report["rows"]:
        out.append("rel: the max error over the largest magnitude of the float64 result")
    if report.get("problem"):
        out.append(f"FAILED: {report['problem']}")
    else:
        out.append("all overrides match aten" if report["ok"] else "MISMATCH: see above")
    return "\n".join(out)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2)
