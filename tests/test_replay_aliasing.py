"""Replay and inputs that share memory: a record is served only to calls whose inputs overlap as
the recorded call's did.

Two tensors can share memory through two storages (``torch.from_numpy`` or ``torch.frombuffer``
twice over one buffer) as well as through one (views of one tensor, ``as_strided``). Replay keys
how a call's inputs overlap by their address ranges, whatever storages hold them, and places a
launch's pointers by address; so a record made for aliased inputs never serves distinct ones (it
would hand the kernel one input twice), and one made for distinct inputs never serves aliased
ones. The test op computes through the front's stand-in launch on CPU (``replay_testing``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from replay_testing import expected_sub, front_of, replayable_sub, replaying, stats, sub_cond

from conftest import compiled_front_problem, router_calls

pytestmark = [pytest.mark.both_fronts,
              pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem()))]

N = 64
KINDS = ("from_numpy", "frombuffer", "views", "as_strided")


def _values(n: int) -> np.ndarray:
    return np.random.randint(-50, 50, n).astype(np.float32)  # integer-valued: exact on every path


def _pair(kind: str, shared: bool, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, ``N`` float32 each, ``y`` starting ``shift`` elements into its memory; with
    ``shared`` one memory holds both (through two storages for from_numpy and frombuffer), else
    each has its own, laid out alike (same offsets, so the same alignment: the same key but for
    how the two overlap)."""
    total = N + shift
    if kind == "from_numpy":
        a = _values(total)
        b = a if shared else _values(total)
        return torch.from_numpy(a)[:N], torch.from_numpy(b)[shift:]
    if kind == "frombuffer":
        a = bytearray(_values(total).tobytes())
        b = a if shared else bytearray(_values(total).tobytes())
        return (torch.frombuffer(a, dtype=torch.float32, count=N),
                torch.frombuffer(b, dtype=torch.float32, count=N, offset=4 * shift))
    t = torch.from_numpy(_values(total))
    u = t if shared else torch.from_numpy(_values(total))
    if kind == "views":
        return t[:N], u[shift:]
    return t.as_strided((8, 8), (8, 1), 0), u.as_strided((8, 8), (8, 1), shift)


def _check(x: torch.Tensor, y: torch.Tensor) -> None:
    want = expected_sub(x.clone(), y.clone())
    torch.testing.assert_close(torch.sub(x, y), want, rtol=0, atol=0)


@pytest.mark.parametrize("shift", [0, 1], ids=["same start", "overlapping"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_record_of_aliased_inputs_never_serves_distinct_ones(dispatch_front, overrides, kind, shift):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    with replaying():
        _check(*_pair(kind, True, shift))  # recorded
        _check(*_pair(kind, True, shift))  # another memory aliased alike: replayed
        distinct = _pair(kind, False, shift)
        _check(*distinct)  # not the aliased call's record: recorded anew
        _check(*distinct)  # replayed from its own record
        if dispatch_front == "compiled":
            assert stats("sub.Tensor")["records"] == 2
            assert stats("sub.Tensor")["replayed"] == 2


@pytest.mark.parametrize("shift", [0, 1], ids=["same start", "overlapping"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_record_of_distinct_inputs_never_serves_aliased_ones(dispatch_front, overrides, kind, shift):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    with replaying():
        distinct = _pair(kind, False, shift)
        _check(*distinct)  # recorded
        _check(*distinct)  # replayed
        x, y = _pair(kind, True, shift)
        entered = router_calls("sub.Tensor", lambda: _check(x, y))
        assert entered == 1  # Python serves it (and records it), under either front
        _check(x, y)
        if dispatch_front == "compiled":
            kinds = sorted(r["kind"] for r in front_of("sub.Tensor").replay_records())
            assert kinds == ["launches", "launches"]


def test_views_of_one_storage_that_do_not_overlap_are_served_as_distinct_inputs(dispatch_front, overrides):
    overrides("sub.Tensor", sub_cond, replayable_sub)
    with replaying():
        _check(torch.from_numpy(_values(N)), torch.from_numpy(_values(N)))  # recorded
        t = torch.from_numpy(_values(2 * N))
        x, y = t[:N], t[N:]  # one storage, disjoint address ranges: the key is the distinct inputs'
        entered = router_calls("sub.Tensor", lambda: _check(x, y))
        assert entered == (0 if dispatch_front == "compiled" else 1)
