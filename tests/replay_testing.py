"""Shared pieces of the replay tests: a replay-ready compiled front on CPU, and a replayable test op.

On CPU the front's replays go to the stand-in launch (``replay_select_test_launch``), which records
what it was given and runs the one kernel it knows: ``out = a + alpha * b + c`` over float32. The
test op ``testsub`` below is an override of ``aten::sub.Tensor`` that computes that in Python (the
Python path) and reports the same launch (the replayed path), so both give ``self - alpha * other
+ 1000``: results can be checked whichever path served a call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from python_native.features import front
from python_native.features.front import replay
from python_native.foundations import launches

MARK = 1000.0


def module():
    """The compiled front's extension module (the session builds it: ``compiled_front_problem``)."""
    return front._state.module


def front_of(op: str, key: str = "CPU", lib: str = "aten"):
    """The C++ front of ``lib::op @ key`` while the compiled front serves."""
    return next(f for slot, f in front._state.fronts.items() if slot.key == (lib, op, key))


def stats(op: str) -> dict:
    return dict(front_of(op).replay_stats())


@contextlib.contextmanager
def replaying() -> Iterator[None]:
    """Replay on, CPU replays to the stand-in, its log and every record cleared after."""
    m = module()
    m.replay_select_test_launch(True)
    try:
        with replay.forced(True):
            yield
    finally:
        m.replay_select_test_launch(False)
        for f in list(front._state.fronts.values()):
            f.replay_clear()


def sub_launch(self: torch.Tensor, other: torch.Tensor, out: torch.Tensor, alpha: float) -> launches.Launch:
    """The stand-in's kernel: ``out = self + (-alpha) * other + MARK``."""
    kernel = int(module().REPLAY_TEST_KERNEL) if module() is not None else 0x7E57
    params = (("p", self), ("p", other), ("p", out), ("i64", self.numel()), ("f32", -float(alpha)),
              ("f32", MARK), ("p", None), ("p", None))
    return launches.Launch(kernel, (1, 1, 1), (32, 1, 1), 0, (1, 1, 1), False, False, params)


def sub_cond(self, other, alpha=1) -> bool:
    """Float32, contiguous, same shape: what the stand-in's kernel takes (a function of the key)."""
    return (isinstance(other, torch.Tensor) and self.dtype == other.dtype == torch.float32
            and self.shape == other.shape and self.is_contiguous() and other.is_contiguous())


@launches.declare_replayable
def replayable_sub(self, other, alpha=1):
    out = torch.empty_like(self)
    torch.sub(self, other, alpha=alpha, out=out)  # runs below the override: aten's kernel
    out.add_(MARK)
    recording = launches.current()
    if recording is not None:
        recording.add(sub_launch(self, other, out, alpha))
    return out


@launches.declare_replayable
def unlaunched_sub(self, other, alpha=1):
    """Declared replayable but launching nothing: its records are refused."""
    return self + (-alpha) * other + MARK


def expected_sub(self, other, alpha=1) -> torch.Tensor:
    """What ``testsub`` answers, computed without ``aten::sub`` (which it overrides)."""
    return self + (-alpha) * other + MARK


def plain_sub(self, other) -> torch.Tensor:
    """aten's answer, computed without ``aten::sub``."""
    return self + (-1) * other
