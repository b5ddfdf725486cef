"""topk, scatter_add and index_add are marked unmeasured: at a GPU key with nothing timing them they
stay out, the status report says why, and a table with their rows (or the opt-in) installs them."""

from __future__ import annotations

import pytest

import python_native as pn

# isort: split
from calibration_testing import H100, rows_winning_from, table

import python_native_dsls.triton as backend
from python_native.core.registry import REGISTRY
from python_native.foundations import env
from python_native.panel import dsl_support
from python_native_dsls.triton import ops as triton_ops
from python_native_dsls.triton.ops import scatter_add, topk

UNMEASURED = {"topk", "scatter_add", "scatter_add_", "index_add", "index_add_"}


@pytest.fixture
def cuda_registration(calib, monkeypatch):
    """The Triton library registered for the CUDA key of a machine of H100s, no table, no opt-in;
    yields the ops it installed."""
    monkeypatch.delenv(env.UNMEASURED[0], raising=False)
    monkeypatch.setattr(triton_ops, "SKIPPED", {})
    monkeypatch.setattr(backend, "dispatch_key", lambda: "CUDA")
    calib.gpus([H100])
    registered: list[str] = []
    monkeypatch.setattr(REGISTRY, "register", lambda dsl, lib, op, key, cond, impl, **o: registered.append(op))
    yield calib, registered


def test_specs_are_marked_unmeasured():
    assert {s.op for s in topk.FAMILY.specs + scatter_add.FAMILY.specs if not s.measured} == UNMEASURED


def test_left_out_at_cuda_and_named_in_the_status_report(cuda_registration):
    _, registered = cuda_registration
    backend.register_overrides()
    assert UNMEASURED.isdisjoint(registered) and "_softmax" in registered
    triton = next(d for d in pn.status()["dsls"] if d["name"] == "triton")
    for op in UNMEASURED:
        assert triton["skipped"][op] == dsl_support.unmeasured_reason(op, "triton", "CUDA")
        assert "not yet timed" in triton["skipped"][op]


def test_a_table_with_their_rows_or_the_opt_in_installs_them(cuda_registration, monkeypatch):
    calib, registered = cuda_registration
    calib.ship(table(H100.key, rows_winning_from("topk", "bfloat16", {0: 20, 1: 20})))
    backend.register_overrides()
    assert "topk" in registered and UNMEASURED - {"topk"} == set(triton_ops.SKIPPED) & UNMEASURED
    registered.clear()
    monkeypatch.setenv(env.UNMEASURED[0], "1")
    backend.register_overrides()
    assert UNMEASURED <= set(registered)
