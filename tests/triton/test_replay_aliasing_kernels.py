"""Replay of the Triton overrides when inputs share memory: every declared replayable op, each pair
of its tensor inputs made to share one memory (through two storages: ``torch.from_numpy`` or
``torch.frombuffer`` twice over one buffer; through one: views of one tensor, ``as_strided``),
from the same start or overlapping.

A record serves only calls whose inputs overlap as the recorded call's did, and what it launches
for a call is what the Python path launches for that very call: each input pointer the call's own.
On CPU the launch path runs on the simulated device and replays go to the front's stand-in launch,
which logs every parameter it was given (see ``test_replay_kernels``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from replay_testing import front_of, module
from test_replay_kernels import CASES, _Mover, _number_bits, _tensors, rms_at_cpu  # noqa: F401 - a fixture
from triton_testing import DEVICE, requires_triton

from conftest import compiled_front_problem
from python_native.features import front
from python_native.features.front import replay
from python_native.foundations import launches
from python_native_dsls.triton import ops as triton_ops
from python_native_dsls.triton import testing

pytestmark = [requires_triton, pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem())),
              pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in launch replays CPU calls")]

REPLAYABLE = sorted({b.op.op for family in triton_ops.families() for b in family if b.op.replayable})
KINDS = ("from_numpy", "frombuffer", "views", "as_strided")
SHIFT = 16  # bytes between the overlapping inputs' starts (keeps 16-byte alignment)


def _tensor_positions(args: tuple) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


# Every case of a replayable op with two tensor inputs or more (one tensor alone shares nothing).
ALIASABLE = [name for name, (op, _, make) in CASES.items() if op in REPLAYABLE and len(_tensor_positions(make())) >= 2]


def test_every_replayable_op_is_covered():
    covered = {CASES[name][0] for name in ALIASABLE}
    single = {op for op, _, make in CASES.values() if len(_tensor_positions(make())) < 2}
    assert REPLAYABLE and set(REPLAYABLE) <= covered | single, set(REPLAYABLE) - covered - single


def _extent(t: torch.Tensor) -> int:
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


def _bases(kind: str, nbytes: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two byte tensors over one memory (``shared``: through two storages for from_numpy and
    frombuffer, one for views and as_strided), else over two of the same allocator."""
    if kind == "from_numpy":
        a = np.zeros(nbytes, np.uint8)
        return torch.from_numpy(a), torch.from_numpy(a if shared else np.zeros(nbytes, np.uint8))
    if kind == "frombuffer":
        a = bytearray(nbytes)
        return torch.frombuffer(a, dtype=torch.uint8), torch.frombuffer(a if shared else bytearray(nbytes),
                                                                         dtype=torch.uint8)
    t = torch.zeros(nbytes, dtype=torch.uint8)
    return t, t if shared else torch.zeros(nbytes, dtype=torch.uint8)


def _place(kind: str, base: torch.Tensor, like: torch.Tensor, offset: int) -> torch.Tensor:
    """``like``'s values, dtype and layout at ``offset`` bytes into ``base``'s memory."""
    if kind == "as_strided":
        out = base.view(like.dtype).as_strided(like.shape, like.stride(), offset // like.element_size())
    else:
        out = base[offset:offset + _extent(like)].view(like.dtype).as_strided(like.shape, like.stride())
    return out.copy_(like)


def _variant(args: tuple, pair: tuple[int, int], kind: str, shift: int, shared: bool) -> tuple:
    """``args`` with the pair's inputs moved into one memory (``shared``), else into two laid out alike."""
    i, j = pair
    nbytes = -(-max(_extent(args[i]), shift + _extent(args[j])) // 16) * 16
    first, second = _bases(kind, nbytes, shared)
    moved = list(args)
    moved[i], moved[j] = _place(kind, first, args[i], 0), _place(kind, second, args[j], shift)
    return tuple(moved)


def _check_replayed(python_path, args, python_out, out, logged) -> None:
    """The replayed launches are the Python path's for the same call (outputs and scratch moved)."""
    mover = _Mover(args, args, python_out, out)
    assert len(logged) == len(python_path)
    for want, got in zip(python_path, logged, strict=True):
        assert got["function"] == want.function
        for (code, value), bits in zip(want.params, got["params"], strict=True):
            assert bits == (mover.expected(value, bits) if code == "p" else _number_bits(code, value)), (code, value)


def _serve(op: str, call, calls: list[tuple]) -> list[bool]:
    """Runs each call through the Python path (replay off), then with replay on; checks every
    replayed call's launches; returns which calls were replayed."""
    m = module()
    expected = []
    for args in calls:
        with launches.recording() as rec:
            expected.append((rec, _tensors(call(*args))))
    replayed = []
    with replay.forced(True):
        for args, (rec, python_out) in zip(calls, expected, strict=True):
            m.replay_test_launches()
            before = front_of(op).replay_stats()["replayed"]
            out = _tensors(call(*args))
            logged = m.replay_test_launches()
            replayed.append(front_of(op).replay_stats()["replayed"] > before)
            if replayed[-1]:
                _check_replayed(rec.launches, args, python_out, out, logged)
    return replayed


@pytest.mark.parametrize("shift", [0, SHIFT], ids=["same start", "overlapping"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ALIASABLE)
@pytest.mark.usefixtures("rms_at_cpu")
@pytest.mark.override
def test_a_record_serves_only_calls_whose_inputs_overlap_alike(case, kind, shift):
    op, call, make = CASES[case]
    args = make()
    with front.serving("compiled"), testing.simulated_device():
        module().replay_select_test_launch(True)
        try:
            for pair in itertools.combinations(_tensor_positions(args), 2):
                aliased = [_variant(args, pair, kind, shift, True) for _ in range(3)]
                distinct = [_variant(args, pair, kind, shift, False) for _ in range(2)]
                calls = [aliased[0], aliased[1], distinct[0], distinct[1], aliased[2]]
                # recorded, replayed; another overlap: recorded, replayed; the first record again
                assert _serve(op, call, calls) == [False, True, False, True, True], pair
                front_of(op).replay_clear()
        finally:
            module().replay_select_test_launch(False)
            front_of(op).replay_clear()
