"""``python -m python_native demo`` runs end to end and reports the overrides it used."""

from __future__ import annotations

import pytest
from triton_testing import requires_triton

from python_native.tools import demo

pytestmark = [requires_triton, pytest.mark.override]


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_demo_reports_overrides_and_agreement(capsys, activation):
    assert demo.main(["--repeats", "1", "--activation", activation]) == 0
    out = capsys.readouterr().out
    for op in ("native_layer_norm", "_softmax_backward_data", "_log_softmax", activation):
        assert op in out
    assert "max |diff|" in out and "median of 1" in out
