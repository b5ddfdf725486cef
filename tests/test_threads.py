"""Stress: threads call an overridden op while others toggle it through every kind of scope."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts

DURATION_S = 3.0


def test_concurrent_calls_and_toggles(overrides):
    overrides("sub.Tensor", always, marked_sub)
    ctl = getattr(pn, TEST_DSL)
    x = torch.arange(4.0)
    routed, plain = torch.full_like(x, 1000), torch.zeros_like(x)
    errors: list[BaseException] = []
    stop = time.monotonic() + DURATION_S

    def caller():
        try:
            while time.monotonic() < stop:
                r = torch.sub(x, x)
                if not (torch.equal(r, routed) or torch.equal(r, plain)):
                    raise AssertionError(f"wrong result {r}")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def toggler(make_scope):
        try:
            while time.monotonic() < stop:
                with make_scope():
                    torch.sub(x, x)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    scopes = [lambda: pn.operations_disabled("sub"), ctl.disabled, lambda: pn.dispatch_keys_disabled("CPU"),
              lambda: pn.operations_disabled("sub.Tensor")]
    threads = [threading.Thread(target=caller) for _ in range(3)]
    threads += [threading.Thread(target=toggler, args=(s,)) for s in scopes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert torch.equal(torch.sub(x, x), routed)  # every scope exited: the override fires again
    assert not pn.is_operation_disabled("sub") and ctl.enabled and not pn.is_dispatch_key_disabled("CPU")
