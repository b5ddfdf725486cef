"""Random draws: ops whose result is their generator's, so aten's bits are no yardstick.

Every seeded op is run a second time from the generator state the first run started from, on
replicas of its inputs (same layout, so a cond's plan still fits), and the two draws must agree
bit for bit: the same ``torch.manual_seed`` must give the same model. aten's reference then runs
from that state too, and the generators are left where the override's own draw left them, so
checked mode changes no random stream.

The statistics are judged against the distribution aten samples: each element is kept (dropout)
or 1 (bernoulli) with its probability; elements whose probability is 0 or 1 must come out so,
and the count over the others must lie within a Bernstein bound that a correct draw leaves about
once in ``1 / FALSE_ALARM`` calls, for any element count. Where anything is random the draw must
also advance a torch generator (one that does not draws the same mask on every call).

- ``native_dropout`` in training (``train=False`` is deterministic and compared with aten): a bool
  mask; the output ``input * mask * scale`` exactly, with aten's ``scale = 1 / (1 - p)`` as one of
  its kernels applies it (rounded to the input's dtype as the CPU kernel does, or to fp32 as the
  CUDA kernel does, and multiplied in that precision), so kept values are scaled and dropped ones
  are zero (NaN for a dropped NaN or infinity, as in aten); the kept count as above.
- ``bernoulli_.float``, ``bernoulli_.Tensor``, ``bernoulli.p``, ``bernoulli``: only zeros and
  ones, the count of ones as above.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import torch

from .compare import compare, first_difference, outputs, pairs, same_values
from .contracts import Call, Contract, broken

FALSE_ALARM = 1e-12  # the chance that a correct draw fails the count check, per call
DRAW, DROPOUT, BERNOULLI = "random draw", "dropout", "bernoulli"


def count_bound(variance: float) -> float:
    """How far a sum of independent 0/1 draws with this total variance strays from its mean, at
    most, but with probability ``FALSE_ALARM`` (Bernstein's inequality: valid for every count)."""
    log_term = math.log(2.0 / FALSE_ALARM)
    return log_term / 3.0 + math.sqrt((log_term / 3.0) ** 2 + 2.0 * variance * log_term)


def _generators(values: list[Any]) -> list[torch.Generator]:
    """The generators a draw can use: those passed in, the CPU's default one, and the default one
    of each CUDA device an input lives on."""
    found = {id(torch.default_generator): torch.default_generator}
    for value in values:
        if isinstance(value, torch.Generator):
            found.setdefault(id(value), value)
        elif isinstance(value, torch.Tensor) and value.device.type == "cuda":
            index = value.device.index if value.device.index is not None else torch.cuda.current_device()
            generator = torch.cuda.default_generators[index]
            found.setdefault(id(generator), generator)
    return list(found.values())


def _restore(generators: list[torch.Generator], states: list[torch.Tensor]) -> None:
    for generator, state in zip(generators, states, strict=True):
        generator.set_state(state)


def replica(value: Any) -> Any:
    """A copy of a tensor argument with its exact size and strides (a plan made for the original
    fits it): a clone where the tensor is dense, else a copy of its storage viewed the same way."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach()
    copy = value.clone()  # keeps the strides of a dense tensor
    if copy.stride() == value.stride():
        return copy
    storage = value.untyped_storage().clone()
    return torch.empty(0, dtype=value.dtype, device=value.device).set_(
        storage, value.storage_offset(), value.size(), value.stride())


def run_seeded(impl: Callable[..., Any], args: tuple, kwargs: dict[str, Any], reference: Callable[[], Any],
               call: Call, where: str) -> tuple[Any, Any]:
    """Run the override, again from the same generator state, and aten's reference from it as
    well; check the two draws agree bit for bit. Returns ``(result, aten's result)``."""
    generators = _generators([*args, *kwargs.values()])
    before = [g.get_state() for g in generators]
    again_args = [replica(a) for a in args]
    again_kwargs = {k: replica(v) for k, v in kwargs.items()}
    result = impl(*args, **kwargs)
    after = [g.get_state() for g in generators]
    try:
        _restore(generators, before)
        again = impl(*again_args, **again_kwargs)
        _restore(generators, before)
        expected = reference()
    finally:
        _restore(generators, after)
    call.advanced = any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))
    _reproduced(result, again, where)
    return result, expected


def _reproduced(first: Any, second: Any, where: str) -> None:
    for a, b, at in outputs(first, second, where):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
            same = same_values(a, b)
            if bool(same.all()):
                continue
            detail = first_difference(same)
        elif a is b or (not isinstance(a, torch.Tensor) and a == b):
            continue
        else:
            detail = "another kind of result"
        raise broken(at, DRAW, f"not reproducible: run again from the same generator state, it drew other "
                               f"values ({detail})")


def _check_count(ones: torch.Tensor, probability: float | torch.Tensor, where: str, contract: str,
                 noun: str) -> bool:
    """The count of True in ``ones`` fits ``probability`` (one for all, or per element); elements
    sure to be 0 or 1 are exactly so. Returns whether anything was left to chance."""
    if not isinstance(probability, torch.Tensor):
        n, q = ones.numel(), probability
        if q in (0.0, 1.0):
            return _sure(ones, torch.full_like(ones, q == 1.0), where, contract, noun)
        count, mean, variance = int(ones.sum()), n * q, n * q * (1.0 - q)
    else:
        q = probability.to(device=ones.device, dtype=torch.float64).expand(ones.shape)
        sure = (q == 0) | (q == 1)
        if bool(sure.any()):
            _sure(ones[sure], q[sure] == 1, where, contract, noun)
        chance = ~sure
        count, mean = int(ones[chance].sum()), float(q[chance].sum())
        variance = float((q * (1 - q))[chance].sum())
    if variance == 0:
        return False
    bound = count_bound(variance)
    if abs(count - mean) > bound:
        raise broken(where, contract, f"{count} of {ones.numel()} elements {noun}, where aten's distribution "
                                      f"gives {mean:.1f} ± {bound:.1f} (a bound a correct draw breaks once in "
                                      f"{1 / FALSE_ALARM:.0e} calls)")
    return True


def _sure(ones: torch.Tensor, want: torch.Tensor, where: str, contract: str, noun: str) -> bool:
    same = ones == want
    if not bool(same.all()):
        raise broken(where, contract, f"elements whose probability is 0 or 1 are not sure: {first_difference(same)} "
                                      f"(True where it should be: {noun})")
    return False


def _advanced(call: Call, random: bool, where: str, contract: str) -> None:
    if random and call.advanced is False:
        raise broken(where, contract, "the draw advanced no torch generator: every call would draw the same")


def _fp32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _scaled_candidates(x: torch.Tensor, mask: torch.Tensor, p: float) -> list[Callable[[], torch.Tensor]]:
    """``input * mask * scale`` as aten's kernels compute it: ``scale`` ``1 / (1 - p)`` from the
    double (CPU) or from ``1 - p`` in fp32 (CUDA), applied in the input's dtype (CPU) or in fp32
    (fp64 for double inputs)."""
    keep = 1.0 - p
    scales = [0.0 if keep == 0 else 1.0 / keep] + ([1.0 / _fp32(keep)] if _fp32(keep) != 0 else [])
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    found = []
    for scale in scales:
        for dtype in dict.fromkeys((wide, x.dtype)):
            factor = torch.tensor(scale, dtype=dtype, device=x.device)
            found.append(lambda d=dtype, f=factor: (x.to(d) * mask.to(d) * f).to(x.dtype))
    return found


def dropout(call: Call, actual: Any, expected: Any, where: str) -> None:
    if call["train"] is False:  # a copy and an all-True mask: nothing random, aten's bits
        compare(actual, expected, where)
        return
    (out, _, _), (mask, _, _) = pairs(actual, expected, where)
    x, p = call["input"], float(call["p"])
    same = None
    for candidate in _scaled_candidates(x, mask, p):
        same = same_values(out, candidate())
        if bool(same.all()):
            break
    else:
        raise broken(where, DROPOUT, f"the output is not input * mask * (1 / (1 - p)) at p = {p} as aten applies "
                                     f"it: kept values scaled, dropped ones zero ({first_difference(same)})")
    random = _check_count(mask, 1.0 - p, where, DROPOUT, "kept")
    _advanced(call, random, where, DROPOUT)


def bernoulli(call: Call, actual: Any, expected: Any, where: str) -> None:
    ((out, _, _),) = pairs(actual, expected, where)
    binary = (out == 0) | (out == 1)
    if not bool(binary.all()):
        raise broken(where, BERNOULLI, f"values other than 0 and 1 ({first_difference(binary)})")
    p = call.get("p")
    probability = call["self"] if p is None else (p if isinstance(p, torch.Tensor) else float(p))
    random = _check_count(out == 1, probability, where, BERNOULLI, "are 1")
    _advanced(call, random, where, BERNOULLI)


CONTRACTS: dict[str, Contract] = {
    "native_dropout": Contract(DROPOUT, dropout, seeded=True),
    **{op: Contract(BERNOULLI, bernoulli, seeded=True)
       for op in ("bernoulli_.float", "bernoulli_.Tensor", "bernoulli.p", "bernoulli")},
}
