"""Specialization keys, profiler ranges and the generated source."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import python_native as pn
from conftest import always, marked_sub
from python_native.foundations import speckey

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def test_spec_key_fast_path_and_fake_tensors_agree():
    real = torch.empty(4, 6).t()
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(real)
    assert speckey.key(real, 3, [1, 2]) == speckey.key(fake, 3, [1, 2])
    assert speckey.key(real) != speckey.key(real.contiguous())
    assert speckey.key(real) != speckey.key(real.half())


def test_spec_key_symbolic_sizes_use_their_hints():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    sym = env.create_symintnode(env.create_symbol(5, ConstantSource("s0")), hint=5)
    assert isinstance(sym, torch.SymInt)
    assert speckey.key([sym, 7], sym) == speckey.key([5, 7], 5)


def test_specialization_cache_builds_once():
    built = []
    cache = speckey.SpecializationCache(lambda n: built.append(n) or n * 2)
    k = speckey.key(torch.empty(3))
    assert cache.get(k, 1) == 2 and cache.get(k, 99) == 2 and built == [1] and len(cache) == 1


def test_profiler_shows_override_range(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with torch.profiler.profile() as prof:
        torch.sub(x, x)
    names = [e.name for e in prof.events()]
    assert "python_native::testdsl::sub.Tensor" in names


def test_router_source_is_straight_line(overrides):
    overrides("sub.Tensor", lambda s, o, alpha: True, marked_sub)
    source = pn.router_source("sub.Tensor", "CPU")
    assert "def _pn_router(_pn_keyset, self, other, *, alpha=" in source
    code = [line for line in source.splitlines() if not line.startswith("#")]
    assert not any(line.lstrip().startswith(("for ", "while ")) for line in code) and "*args" not in source
    assert "_pn_fallback.call_boxed(_pn_keyset, self, other, alpha=alpha)" in source
