"""The contracts checked mode judges an op by where aten does not fix the bits of its result.

Most ops have one right answer, and checked mode compares an override's result with aten's
within a tolerance. Some do not: which of several tied elements ``topk`` or ``max.dim`` names is
the kernel's choice, and a random op's draw is its generator's. Comparing those with aten's bits
raises false alarms, so such an op is judged by the contract aten keeps instead (``selection.py``:
ties; ``draws.py``: random draws). The table is keyed by the functional op, ``"lib::name"``,
and holds for every override of the op (any DSL, or a user's own) and for the in-place and
``out=`` forms derived from it, which checked mode judges by their functional result.

Any other op aten tags ``nondeterministic_seeded`` (a random op with no contract here) is judged
by what holds for every random op: the draw is reproducible under the same generator state, and
each output has aten's dtype, shape, device and contiguity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from python_native.foundations.schema import OpSignature, find_overload, qualify, split_symbol

from .compare import OverrideMismatch, pairs


class Call:
    """One call's arguments by schema name, defaults filled in, as aten's reference receives them."""

    __slots__ = ("values", "advanced")

    def __init__(self, sig: OpSignature, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.values = {p.schema_name: p.default for p in sig.params if p.has_default}
        self.values.update(zip((p.schema_name for p in sig.positional), args, strict=False))
        self.values.update(kwargs)
        # For a seeded op: whether the override's draw moved a generator (set by ``draws.run_seeded``).
        self.advanced: bool | None = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


Judge = Callable[[Call, Any, Any, str], None]


@dataclass(frozen=True)
class Contract:
    """How checked mode judges one op: ``judge(call, actual, expected, where)`` raises
    ``OverrideMismatch`` (through ``broken``) where the override's result breaks the contract.
    ``seeded`` ops draw random numbers: the override is run a second time from the same generator
    state, and both draws must agree bit for bit, before ``judge`` sees the first."""

    name: str
    judge: Judge
    seeded: bool = False


CONTRACTS: dict[str, Contract] = {}


def key(lib: str, op: str) -> str:
    """``"aten::topk"`` for ``("aten", "topk")`` and ``("aten", "topk.default")`` alike."""
    return f"{lib}::{qualify(*split_symbol(op))}"


def judge_by(lib: str, op: str, contract: Contract) -> None:
    """Judge every override of ``lib::op`` by ``contract`` in checked mode, from its next registration."""
    if not isinstance(contract, Contract):
        raise TypeError(f"a contract must be a Contract, got {type(contract).__name__}: {contract!r}")
    if find_overload(lib, op) is None:
        raise ValueError(f"cannot judge {lib}::{op} by a contract: no such op")
    CONTRACTS[key(lib, op)] = contract


def broken(where: str, contract: str, detail: str) -> OverrideMismatch:
    """The error for a broken contract: the override, the contract, what broke."""
    return OverrideMismatch(f"{where} breaks the {contract} contract: {detail}")


def _kinds_only(call: Call, actual: Any, expected: Any, where: str) -> None:
    pairs(actual, expected, where)


# A random op with no contract of its own: reproducible, with aten's kind of result.
SEEDED = Contract("random draw", _kinds_only, seeded=True)


def contract_for(lib: str, op: str) -> Contract | None:
    """The contract ``lib::op`` is judged by, or None: compared with aten's result."""
    found = CONTRACTS.get(key(lib, op))
    if found is not None:
        return found
    overload = find_overload(lib, op)
    if overload is not None and torch.Tag.nondeterministic_seeded in overload.tags:
        return SEEDED
    return None
