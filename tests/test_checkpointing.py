"""The custom ops under training stacks that re-run or move what autograd saved: activation
checkpointing (reentrant and not, the random state replayed) and activation offloading
(``save_on_cpu``). Each op's autograd reads its saved tensors once, as non-reentrant checkpointing
and saved-tensor hooks require, and the gradients equal those of the plain run, with the overrides
serving (the Triton kernels under the interpreter, or the test DSL's stand-ins) and with them off.
A tiny Llama patched and trained one step with ``gradient_checkpointing_enable()`` matches the
unpatched model."""

from __future__ import annotations

import collections
import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import python_native as pn
from conftest import TEST_DSL
from python_native.foundations import custom_ops, public_names

REGIMES = ("reentrant", "non_reentrant", "rng_replayed", "offloaded")
DROPOUT = 0.25


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _lce(g: torch.Generator) -> tuple:
    target = torch.randint(0, 40, (12,), generator=g)
    target[::5] = -100
    return _randn(g, 12, 16), _randn(g, 40, 16) / 4, target, _randn(g, 40), "mean", -100, 0.1


# Arguments of each custom op with autograd (tensors that are floating point take gradients).
SAMPLES = {
    "rms_norm": lambda g: (_randn(g, 2, 5, 16), 1 + _randn(g, 16) / 10, 1e-6, 0.0, False),
    "swiglu": lambda g: (_randn(g, 6, 16), _randn(g, 6, 16)),
    "geglu": lambda g: (_randn(g, 6, 16), _randn(g, 6, 16), "tanh"),
    "rotary": lambda g: (_randn(g, 2, 4, 5, 8), _randn(g, 2, 2, 5, 8), _randn(g, 2, 5, 8), _randn(g, 2, 5, 8), 1),
    "gelu_tanh": lambda g: (_randn(g, 6, 16),),
    "quick_gelu": lambda g: (_randn(g, 6, 16),),
    "linear_cross_entropy.forward": _lce,
    "moe_route": lambda g: (_randn(g, 6, 8), 2, "softmax", False, True, 0.0, None, 1, 1, 1.0, False),
    "moe_experts": lambda g: (_randn(g, 6, 16), torch.tensor([[0, 2], [2, 1], [0, 1], [1, 2], [2, 0], [0, 2]]),
                              _randn(g, 6, 2), _randn(g, 4, 16, 16) / 4, _randn(g, 4, 16, 8) / 4, None, None,
                              "silu", False, False, 7.0, 1.702, "sum"),
}
# Tensors that take no gradient, per op: rotary's cos and sin, as the models pass them (the
# tables' own gradients are a second case below).
FROZEN = {"rotary": (2, 3)}


def _autograd_ops() -> list[str]:
    """The package's custom ops with autograd (other tests declare ops of their own in the namespace)."""
    return [d.name for d in custom_ops.defined() if d.autograd and not d.name.startswith("pn_test")]


def _backward_of(name: str) -> str:
    packet, _, overload = name.partition(".")
    return f"{packet}.backward" if overload == "forward" else f"{packet}_backward"


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.python_native, packet), overload or "default")


def test_every_custom_op_with_autograd_has_a_sample():
    assert sorted(_autograd_ops()) == sorted(SAMPLES)
    assert all(custom_ops.is_custom_op(_backward_of(name)) for name in SAMPLES)


def _leaves(name: str, frozen: tuple[int, ...]) -> list:
    args = SAMPLES[name](torch.Generator().manual_seed(0))
    return [a.clone().requires_grad_(i not in frozen) if torch.is_tensor(a) and a.is_floating_point() else a
            for i, a in enumerate(args)]


def _function(name: str, args: list, dropout: bool):
    """The op on ``args`` with the tensors passed as arguments (as ``checkpoint`` takes them), the
    first one through dropout where the random state matters; returns the differentiable outputs."""
    at = [i for i, a in enumerate(args) if torch.is_tensor(a)]
    op = _overload(name)

    def fn(*tensors):
        call = list(args)
        for i, t in zip(at, tensors, strict=True):
            call[i] = t
        if dropout:
            call[0] = F.dropout(call[0], DROPOUT, training=True)
        out = op(*call)
        return out if isinstance(out, tuple) else (out,)

    return fn, [args[i] for i in at]


@functools.cache
def _differentiable(name: str) -> tuple[int, ...]:
    """Which outputs carry gradients (not linear_cross_entropy's log-sum-exp), asked of a plain call
    (a reentrant checkpoint's forward runs without autograd)."""
    fn, tensors = _function(name, _leaves(name, ()), dropout=False)
    return tuple(i for i, out in enumerate(fn(*tensors)) if out.requires_grad)


def _run(name: str, regime: str | None, frozen: tuple[int, ...]) -> tuple[list, list]:
    """Outputs and input gradients of one forward and backward under ``regime`` (None: plain)."""
    args = _leaves(name, frozen)
    fn, tensors = _function(name, args, dropout=regime in (None, "rng_replayed"))
    torch.manual_seed(1)
    if regime in ("reentrant", "non_reentrant", "rng_replayed"):
        outs = checkpoint(fn, *tensors, use_reentrant=regime == "reentrant", preserve_rng_state=True)
    else:
        with torch.autograd.graph.save_on_cpu() if regime == "offloaded" else contextlib.nullcontext():
            outs = fn(*tensors)
    outs = [outs[i] for i in _differentiable(name)]
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    torch.manual_seed(3)  # a reentrant checkpoint recomputes here: another random state
    torch.autograd.backward(outs, weights)
    return [o.detach() for o in outs], [t.grad for t in tensors if t.requires_grad]


def _plain(name: str, regime: str, frozen: tuple[int, ...]) -> tuple[list, list]:
    """The plain run to compare with: through dropout where the regime's run is."""
    if regime == "rng_replayed":
        return _run(name, None, frozen)
    args = _leaves(name, frozen)
    fn, tensors = _function(name, args, dropout=False)
    outs = fn(*tensors)
    outs = [outs[i] for i in _differentiable(name)]
    g = torch.Generator().manual_seed(2)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs])
    return [o.detach() for o in outs], [t.grad for t in tensors if t.requires_grad]


def _served_by(name: str) -> str | None:
    from python_native.core.registry import REGISTRY

    slot = REGISTRY.slots.get(("python_native", name, "CPU"))
    return next((o.dsl for o in slot.overrides if o.dsl != TEST_DSL), None) if slot is not None else None


@contextlib.contextmanager
def _overrides(on: bool, name: str):
    """The op's overrides serving (the test DSL's stand-ins where no backend serves at CPU), or off."""
    if not on:
        if _served_by(name) is None:
            pytest.skip(f"no backend serves {name} at the CPU key here: no override to switch off")
        with pn.operations_disabled(public_names.public_name_of(name) or name.partition(".")[0]):
            yield
        return
    if _served_by(name) is None:
        if name == "linear_cross_entropy.forward":
            pytest.skip("no backend serves linear_cross_entropy at the CPU key here")
        from patch_testing import serving

        with serving():
            yield
        return
    yield


@pytest.mark.parametrize("overrides", ["on", "off"])
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_gradients_equal_the_plain_runs(name, regime, overrides):
    frozen = FROZEN.get(name, ())
    _differentiable(name)  # asked before the trace opens
    with _overrides(overrides == "on", name):
        want = _plain(name, regime, frozen)
        with pn.trace() as t:
            got = _run(name, regime, frozen)
    for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    outcome = "override" if overrides == "on" else "fallback"
    forwards = [e for e in t.events if e.op == name]
    backwards = [e for e in t.events if e.op == _backward_of(name)]
    recomputed = regime != "offloaded"  # a checkpoint runs the forward again for the backward
    assert len(forwards) == 1 + recomputed and len(backwards) == 1, [(e.op, e.outcome) for e in t.events]
    assert {(e.outcome, e.dsl is not None) for e in forwards + backwards} == {(outcome, overrides == "on")}


@pytest.mark.parametrize("regime", REGIMES)
def test_rotary_tables_take_their_gradients_under_each_regime(regime):
    """cos and sin requiring gradients: the op keeps q and k too, and reads all four once."""
    want = _plain("rotary", regime, ())
    got = _run("rotary", regime, ())
    assert len(got[1]) == 4
    for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore:.*gradient_checkpointing_enable:FutureWarning")
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_a_patched_llama_trains_with_gradient_checkpointing(reentrant):
    """One training step of a tiny Llama with transformers' own checkpointing: the patched model's
    loss and gradients are the unpatched model's, each decoder layer's ops run through the overrides
    twice (the forward, then again for the backward) and their backwards once."""
    pytest.importorskip("transformers")
    from patch_testing import aten_overrides_off, inputs, installed_at_cpu, model, serving, step

    m = model("llama").train()
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    batch = inputs(m)
    with serving(), aten_overrides_off():
        loss, grads = step(m, batch)
        with pn.patched(m), pn.trace() as t:
            patched_loss, patched_grads = step(m, batch)
    torch.testing.assert_close(patched_loss, loss, rtol=1e-6, atol=0)
    assert patched_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(patched_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    served = collections.Counter(e.op for e in t.events if e.outcome == "override")
    layers = m.config.num_hidden_layers
    norms = 2 * layers + 1  # two per decoder layer, and the final one outside the checkpoints
    assert (served["rotary"], served["rotary_backward"]) == (2 * layers, layers), served
    assert (served["swiglu"], served["swiglu_backward"]) == (2 * layers, layers), served
    assert (served["rms_norm"], served["rms_norm_backward"]) == (2 * norms - 1, norms), served
    if installed_at_cpu("linear_cross_entropy.forward"):
        assert served["linear_cross_entropy.forward"] == served["linear_cross_entropy.backward"] == 1, served
