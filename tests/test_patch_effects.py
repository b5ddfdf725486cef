"""``pn.patch`` and side effects: a forward that writes state, logs or prints is left alone unprobed,
with what it writes in the report; the probes that do run leave no trace on the model or the process."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from torch import nn

# isort: split
from test_patch_rules import Act, Block, Norm

import python_native as pn

CALLS = {"n": 0}
COUNT = 0
logger = logging.getLogger("tests.patch_effects")


def _norm(module: Norm, x: torch.Tensor) -> torch.Tensor:
    return Norm.forward(module, x)


class AttributeNorm(Norm):
    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        return _norm(self, x)


class AugmentedNorm(Norm):
    calls = 0

    def forward(self, x):
        self.calls += 1
        return _norm(self, x)


class GlobalNorm(Norm):
    def forward(self, x):
        global COUNT
        COUNT += 1
        return _norm(self, x)


class ItemNorm(Norm):
    def forward(self, x):
        CALLS["n"] += 1
        return _norm(self, x)


class LoggingNorm(Norm):
    def forward(self, x):
        logger.warning("norm called")
        return _norm(self, x)


class PrintingNorm(Norm):
    def forward(self, x):
        print("norm called")
        return _norm(self, x)


class HelperNorm(Norm):
    """The write sits in a method the forward calls on self."""

    def _remember(self, x):
        self.last_shape = tuple(x.shape)

    def forward(self, x):
        self._remember(x)
        return _norm(self, x)


def _closure_norm() -> tuple[type, list]:
    count = 0
    seen: list[int] = []

    class ClosureNorm(Norm):
        def forward(self, x):
            nonlocal count
            count += 1
            seen.append(count)
            return _norm(self, x)

    return ClosureNorm, seen


def _counter(kind: str, capsys, caplog):
    """(norm class, what the report names, the number of real calls so far)."""
    if kind == "nonlocal":
        cls, seen = _closure_norm()
        return cls, "declares nonlocal count", lambda m: len(seen)
    start = {"global": COUNT, "item": CALLS["n"]}
    return {
        "attribute": (AttributeNorm, "writes self.calls", lambda m: getattr(m.norm, "calls", 0)),
        "augmented": (AugmentedNorm, "writes self.calls", lambda m: m.norm.calls),
        "global": (GlobalNorm, "declares global COUNT", lambda m: COUNT - start["global"]),
        "item": (ItemNorm, "writes CALLS['n']", lambda m: CALLS["n"] - start["item"]),
        "logger": (LoggingNorm, "calls a logger (logger.warning)",
                   lambda m: sum(r.getMessage() == "norm called" for r in caplog.records)),
        "print": (PrintingNorm, "calls print", lambda m: capsys.readouterr().out.count("norm called")),
        "helper": (HelperNorm, "through self._remember, writes self.last_shape",
                   lambda m: int("last_shape" in vars(m.norm))),
    }[kind]


@pytest.mark.parametrize("kind", ["attribute", "augmented", "global", "nonlocal", "item", "logger", "print", "helper"])
def test_a_forward_with_a_side_effect_is_left_alone_unprobed_and_its_effect_counts_the_real_calls(kind, capsys, caplog):
    caplog.set_level(logging.WARNING, logger=logger.name)
    cls, what, calls = _counter(kind, capsys, caplog)
    block = Block()
    block.norm = cls(32)
    report = pn.patch(block)
    try:
        (entry,) = [e for e in report.entries if e.target == cls.__name__]
        assert (entry.rule, entry.status) == ("rms_norm", "left alone")
        assert what in entry.detail and "neither probed nor routed" in entry.detail, entry.detail
        assert calls(block) == 0  # no probe ran the forward
        assert "forward" not in block.norm.__dict__
        x = torch.randn(2, 32)
        block(x)
        block(x)
        assert calls(block) == (1 if kind == "helper" else 2)
        assert {e.target for e in report.patched} == {"FusedMlp", "Act"}  # the rest is routed as before
    finally:
        pn.unpatch(block)


def test_an_activation_that_keeps_state_and_a_function_that_counts_are_left_alone():
    class RememberingAct(Act):
        def forward(self, x):
            self.last = x.detach()
            return super().forward(x)

    block = Block()
    block.act = RememberingAct()
    report = pn.patch(block, dry_run=True)
    (entry,) = [e for e in report.entries if e.target == "RememberingAct"]
    assert (entry.rule, entry.status) == ("activation", "left alone") and "writes self.last" in entry.detail
    assert "last" not in vars(block.act)

    model = Rotating()
    report = pn.patch(model, dry_run=True)
    (entry,) = [e for e in report.entries if e.kind == "function"]
    assert (entry.rule, entry.status) == ("rotary", "left alone")
    assert entry.detail.startswith("the function declares global ROTATIONS"), entry.detail
    assert ROTATIONS == 0


ROTATIONS = 0


def rotate_counted(q, k, cos, sin, unsqueeze_dim=1):
    global ROTATIONS
    ROTATIONS += 1
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    return q * cos + half(q) * sin, k * cos + half(k) * sin


class Rotating(nn.Module):
    def forward(self, q, k, cos, sin):
        return rotate_counted(q, k, cos, sin)


def _track(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    module.hits.add_(1)
    module.seen = x.shape
    module.train(not module.training)
    return torch.rand(()) * 0 + random.random() * 0


class Tracking(nn.Module):
    """No rule takes it, but the activation rule's probe runs it: its forward's own source is clean,
    and the module-level helper it calls (which no static check reads) changes a buffer, an
    attribute and the training flag, and draws random numbers."""

    def __init__(self):
        super().__init__()
        self.register_buffer("hits", torch.zeros(()))

    def forward(self, x):
        return x + _track(self, x)


def test_probes_leave_no_trace_on_the_model():
    model = nn.Sequential(Block(), Tracking()).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = {name: set(vars(m)) for name, m in model.named_modules()}
    report = pn.patch(model, dry_run=True)
    assert {e.target for e in report.patched} == {"Norm", "FusedMlp", "Act"}
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert {name: set(vars(m)) for name, m in model.named_modules()} == attrs
    assert not any(m.training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_probes_leave_the_random_streams_as_they_were():
    model = nn.Sequential(Block(), Tracking())
    torch.manual_seed(3)
    random.seed(3)
    rng, py_rng = torch.get_rng_state(), random.getstate()
    pn.patch(model, dry_run=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert random.getstate() == py_rng
