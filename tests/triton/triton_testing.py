"""Shared pieces of the Triton library tests: skip rules, running a function with and without the
overrides, and reading the trace."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import python_native as pn  # first: importing python_native_dsls.triton before python_native skips its registration

# isort: split
import python_native_dsls.triton as backend
from python_native.foundations import tolerances
from python_native.tools import verify

requires_triton = pytest.mark.skipif(
    not backend.runtime_available(), reason=f"triton backend unavailable: {backend.unavailable_reason()}"
)

DEVICE = backend.device_type()
KEY = backend.dispatch_key()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Run:
    """Outputs and input gradients of one forward+backward, with the trace events it produced."""

    out: torch.Tensor
    grads: list[torch.Tensor | None]
    events: list

    def outcomes(self, op: str) -> set[tuple[str | None, str]]:
        """``(dsl, outcome)`` pairs recorded for ``op``."""
        return {(e.dsl, e.outcome) for e in self.events if e.op == op}

    def overridden(self, op: str) -> bool:
        return ("triton", "override") in self.outcomes(op)

    def fell_back(self, op: str) -> bool:
        return (None, "fallback") in self.outcomes(op) and not self.overridden(op)

    def declined(self, op: str, why: str) -> bool:
        """Whether aten served every call of ``op``, the Triton override saying ``why`` (see ``routing_problems``)."""
        return not routing_problems(self.events, {op: why})

    def triton_events(self) -> list:
        return [e for e in self.events if e.dsl == "triton"]


def routing_problems(events: Iterable, expected: dict[str, str | None]) -> list[str]:
    """What in ``events`` (a trace's) contradicts ``expected``: per op symbol, None where a Triton
    override must have served it (at least one call), else words the Triton override's reason must
    hold (in at least one call: a backward may route the same op for other reasons) where it declined
    or was switched off, and aten served every call of the op. An op never dispatched contradicts
    either: a test that saw no routed call proves nothing about the override."""
    events = list(events)
    problems = []
    for op, why in expected.items():
        seen = [(e.dsl, e.outcome, e.reason or "") for e in events if e.op == op]
        served = [s for s in seen if s[:2] == ("triton", "override")]
        if why is None and not served:
            problems.append(f"{op}: no Triton override served it ({seen or 'never dispatched'})")
        elif why is not None and (served or not any(_triton_says(r, why) for _, _, r in seen)):
            problems.append(f"{op}: expected the Triton override to decline saying '{why}', got {seen or 'never dispatched'}")
    return problems


def _triton_says(reason: str, why: str) -> bool:
    """Whether the Triton part of a fallback's reason (``"triton: ...; cutedsl: ..."``) holds ``why``."""
    return any(part.startswith("triton: ") and why in part for part in reason.split("; "))


def assert_routed(events: Iterable, expected: dict[str, str | None], what: str) -> None:
    """``routing_problems`` is empty, else fail naming them."""
    problems = routing_problems(events, expected)
    assert not problems, f"{what}: " + "; ".join(problems)


def elementwise_contract(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` (an elementwise aten op) as its contract computes it, for special values on the CPU.

    The kernels serve the device a GPU build runs on; their special values (``gelu(inf) = inf``,
    ``gelu(-inf) = NaN``) are aten's CUDA kernel's, which computes the op's formula element by
    element. aten's vectorised CPU kernels need not agree lane by lane (on some x86 builds the
    vector gelu gives NaN at +inf whatever ``ATEN_CPU_CAPABILITY`` says, while its scalar tail gives
    inf), so on the CPU the reference applies ``fn`` to one element at a time: the scalar path, the
    same formula as CUDA's. Elsewhere ``fn`` is the reference as it is. Autograd flows through, and
    the result keeps ``x``'s layout as aten's elementwise ops do.
    """
    if DEVICE != "cpu":
        return fn

    def one_at_a_time(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        parts = [fn(flat[i:i + 1]) for i in range(flat.numel())]
        values = torch.cat(parts) if parts else fn(flat)
        return torch.empty_like(x, dtype=values.dtype).copy_(values.view(x.shape))

    return one_at_a_time


def make(*shape: int, dtype: torch.dtype = torch.float32, requires_grad: bool = True, scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(*shape, dtype=torch.float32, device=DEVICE) * scale
    return t.to(dtype).requires_grad_(requires_grad)


def leaf_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh leaf with ``t``'s values, sizes and strides (so strided test inputs stay strided)."""
    copy = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    return copy.copy_(t.detach()).requires_grad_(t.requires_grad)


def run(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor | None = None,
    scope: contextlib.AbstractContextManager | None = None,
) -> Run:
    """``fn(*inputs)`` and its backward against ``grad_out`` on fresh leaf copies, traced."""
    leaves = [leaf_copy(t) for t in inputs]
    with scope or contextlib.nullcontext(), pn.trace() as trace:
        out = fn(*leaves)
        if out.requires_grad:
            out.backward(torch.ones_like(out) if grad_out is None else grad_out)
    return Run(out.detach(), [t.grad for t in leaves], list(trace.events))


TOLERANCES = tolerances.TOLERANCES  # the package's one table (per class of op: tolerances.tolerance)


@pytest.fixture(scope="module")
def unmeasured_installed() -> None:
    """The ops no GPU has measured yet are installed at the CUDA key only with
    ``PYTHON_NATIVE_UNMEASURED=1`` (``benchmarks/gpu_all.sh`` sets it for the suite); without it
    their tests are skipped there, not failed (use it in the module's tests)."""
    from python_native.foundations import env

    if DEVICE != "cpu" and not env.unmeasured_allowed():
        pytest.skip(f"unmeasured ops stay off at the CUDA key: set {env.UNMEASURED[0]}=1 to test them")


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test draws the same inputs whatever runs before it (import it into a test module)."""
    torch.manual_seed(0)


@pytest.fixture
def deterministic() -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` for one test (import it into a test module)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def assert_matches(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, what: str, grad: bool = False) -> None:
    """``got`` passes ``python_native.tools.verify.mismatch`` against aten's ``ref`` and the float64 ``truth``."""
    why = verify.mismatch(got, ref, truth, what, grad=grad)
    assert why is None, why


def compare(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], ops: Iterable[str]) -> Run:
    """Run ``fn`` forward and backward with the overrides, with the Triton DSL disabled, and in
    float64; values and gradients must agree (see ``assert_matches``), and each of ``ops`` must
    have been served by a Triton override."""
    probe = fn(*[t.detach() for t in inputs])
    grad_out = torch.randn_like(probe, dtype=torch.float32).to(probe.dtype)  # in the output's layout
    got = run(fn, inputs, grad_out)
    ref = run(fn, inputs, grad_out, scope=pn.triton.disabled())
    wide = [leaf_copy(t.detach().double()).requires_grad_(t.requires_grad) for t in inputs]
    truth = run(fn, wide, grad_out.double(), scope=pn.triton.disabled())
    assert not ref.triton_events() and not truth.triton_events()
    for op in ops:
        assert got.overridden(op), f"{op}: {got.outcomes(op) or 'never dispatched'}"
    assert_matches(got.out, ref.out, truth.out, "output")
    for i, (g, r, t) in enumerate(zip(got.grads, ref.grads, truth.grads, strict=True)):
        assert (g is None) == (r is None), f"gradient {i}: {g} vs {r}"
        if r is not None:
            assert_matches(g, r, t, f"gradient of input {i}", grad=True)
    return got


def lower_register_max(monkeypatch: pytest.MonkeyPatch, value: int) -> list[str]:
    """Set the norm backward's register limit to ``value`` for one test, plan afresh under it (plans
    read the limit when built, and are cached), and return the list of paths the backward launches
    then take: ``"rows"`` (whole rows in registers) or ``"columns"`` (streamed column strips)."""
    from python_native.foundations.speckey import SpecializationCache
    from python_native_dsls.triton.kernels import norm_backward, tuning

    monkeypatch.setattr(tuning, "NORM_BWD_REGISTER_MAX", value)
    monkeypatch.setattr(norm_backward, "_PLANS", SpecializationCache(norm_backward._build_plan))
    paths: list[str] = []
    for name, launcher in (("rows", norm_backward._ROWS), ("columns", norm_backward._COLS)):
        monkeypatch.setattr(launcher, "planned", lambda *a, _real=launcher.planned, _name=name: paths.append(_name) or _real(*a))
    return paths


def traced(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn()``'s result, and the ops a Triton override ran for it (read from the trace)."""
    with pn.trace() as t:
        out = fn()
    return out, [e.op for e in t.events if e.dsl == "triton" and e.outcome == "override"]


def aten(fn: Callable[[], Any]) -> Any:
    """``fn()`` with the Triton overrides off: aten's answer to compare against."""
    with pn.triton.disabled():
        return fn()


def compile_in_fresh_process(script: str, **env: str) -> str:
    """Run ``script`` in a process of its own with the interpreter off and return what it printed.

    The interpreter runs a kernel's Python, not Triton's compiler: a kernel can pass every
    interpreted test and still fail to compile for a GPU. Triton compiles to a cubin without a
    device (it ships ptxas), so a compile check runs wherever Triton's NVIDIA backend is installed."""
    pytest.importorskip("triton.backends.nvidia")
    root = Path(__file__).resolve().parents[2]
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHON_NATIVE_TRITON_INTERPRET")}
    clean.update(TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
                 **env)
    proc = subprocess.run([sys.executable, "-c", script], env=clean, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout
