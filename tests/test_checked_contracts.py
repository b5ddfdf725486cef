"""Checked mode judges ops whose bits aten leaves open by aten's contract: ties and random draws.

Overrides of real aten ops (at the CPU key, in the test DSL, ahead of the Triton ones) that keep
the contract pass in another order or with another draw than aten's; each that breaks it raises
``OverrideMismatch`` naming the op and the contract.
"""

from __future__ import annotations

import pytest
import torch

import python_native as pn
from conftest import always
from python_native.features.checked import Contract, OverrideMismatch, judge_by
from python_native.features.checked.draws import count_bound


@pytest.fixture
def checked(overrides, monkeypatch):
    """Register an override in checked mode, ahead of any other at its slot."""
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    return lambda op, impl, **kw: overrides(op, always, impl, priority=100, **kw)


TIES = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 5.0, 5.0, -1.0]])


def last_first_topk(self, k, dim=-1, largest=True, sorted=True):
    """topk naming the last of tied elements first (aten names another): within the contract."""
    n = self.shape[dim]
    values, index = self.flip(dim).sort(dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), (n - 1 - index).narrow(dim, 0, k).contiguous()


def test_topk_ties_in_another_order_pass(checked):
    checked("topk", last_first_topk, derive_forms=("out",))
    values, index = torch.topk(TIES, 3)
    assert index[0].tolist() == [4, 2, 1] and torch.equal(values, TIES.gather(1, index))
    values, index = torch.topk(TIES, 2, largest=False, sorted=False)
    assert torch.equal(values, TIES.gather(1, index))
    out = (torch.empty(0), torch.empty(0, dtype=torch.int64))
    torch.topk(TIES, 2, out=out)  # the derived out= form is judged by the same contract
    assert out[1][1].tolist() == [3, 2]


@pytest.mark.parametrize(
    ("bad_index", "message"),
    [
        (lambda i: torch.where(i == 4, 3, i), "names an element that differs from the value"),
        (lambda i: i[..., :1].expand_as(i).contiguous(), "appears twice"),
        (lambda i: i + 5, "outside the dim's size 5"),
    ],
    ids=["wrong-tie", "repeated", "out-of-range"],
)
def test_topk_bad_indices_raise(checked, bad_index, message):
    def bad_topk(self, k, dim=-1, largest=True, sorted=True):
        values, index = last_first_topk(self, k, dim, largest, sorted)
        return values, bad_index(index)

    checked("topk", bad_topk, derive_forms=("out",))
    with pytest.raises(OverrideMismatch, match=rf"aten::topk @ CPU.*breaks the ties contract: .*{message}"):
        torch.topk(TIES, 3)
    out = (torch.empty(0), torch.empty(0, dtype=torch.int64))
    with pytest.raises(OverrideMismatch, match=r"topk\.values @ CPU.*ties contract"):
        torch.topk(TIES, 3, out=out)


def test_topk_wrong_values_raise(checked):
    checked("topk", lambda self, k, dim=-1, largest=True, sorted=True: last_first_topk(self, k, dim, not largest))
    with pytest.raises(OverrideMismatch, match=r"aten::topk @ CPU.*differs from aten in its values"):
        torch.topk(TIES, 2)


def test_max_dim_ties(checked):
    def last_max(self, dim, keepdim=False):
        values, index = last_first_topk(self, 1, dim)
        return (values, index) if keepdim else (values.squeeze(dim), index.squeeze(dim))

    handle = checked("max.dim", last_max)
    assert torch.max(TIES, 1).indices.tolist() == [4, 3]
    assert torch.max(TIES, 1, keepdim=True).indices.tolist() == [[4], [3]]
    handle.remove()
    checked("max.dim", lambda self, dim, keepdim=False: (last_max(self, dim, keepdim)[0], torch.zeros(2, dtype=torch.long)))
    with pytest.raises(OverrideMismatch, match=r"aten::max\.dim @ CPU.*ties contract: an index names"):
        torch.max(TIES, 1)


def test_unstable_sort_is_judged_by_ties_and_stable_sort_by_bits(checked):
    def last_first_sort(self, *, stable, dim=-1, descending=False):
        n = self.shape[dim]
        with pn.operations_disabled("sort"):
            values, index = self.flip(dim).sort(dim=dim, descending=descending, stable=True)
        return values, n - 1 - index

    checked("sort.stable", last_first_sort)
    values, index = torch.sort(TIES, stable=False)
    assert index[1].tolist() == [4, 1, 0, 3, 2]
    with pytest.raises(OverrideMismatch, match=r"sort\.stable @ CPU\), output 1 differs from aten"):
        torch.sort(TIES, stable=True)


def test_argmax_stays_compared_bit_for_bit(checked):
    # aten documents the first maximal index: another tied one is a mismatch, not a tie.
    checked("argmax", lambda self, dim=None, keepdim=False: last_first_topk(self, 1, dim)[1].squeeze(dim))
    with pytest.raises(OverrideMismatch, match="differs from aten"):
        torch.argmax(TIES, 1)


def test_judge_by_refuses_bad_contracts():
    with pytest.raises(ValueError, match="aten::no_such_op"):
        judge_by("aten", "no_such_op", Contract("x", lambda *a: None))
    with pytest.raises(TypeError, match="must be a Contract"):
        judge_by("aten", "topk", lambda *a: None)


def test_count_bound_is_binomial_sized():
    assert 6 * 50 < count_bound(10_000 * 0.25) < 8 * 50  # 6 to 8 standard deviations for large counts
    assert count_bound(0.0) > 1  # a handful of elements is never judged by a normal approximation
