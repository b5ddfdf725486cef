"""What the model-patching tests share: tiny models, and stand-in overrides for the custom ops.

Where a backend installs an override of a custom op at the CPU key (the Triton kernels, under
the interpreter), that override serves the tests. Where none is installed, ``serving()`` registers
a stand-in of the test DSL there, which computes the op's reference in plain torch without calling
the op: the routing from a patched module through the dispatcher to an override is then proven
all the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import python_native as pn
from conftest import TEST_DSL, always
from python_native.core.registry import REGISTRY
from python_native.foundations import custom_ops
from python_native.tools import tiny_models


def _stand_ins() -> dict[str, tuple]:
    """op -> (reference kernel, public name, is a backward), for every op the package declares with a
    kernel of its own: a backward is declared as ``<public>_backward`` or as the ``backward`` overload."""
    import python_native.ops  # noqa: F401  (declares them)

    found = {}
    for d in custom_ops.defined():
        if d.reference is None or not d.reference.__module__.startswith("python_native.ops."):
            continue
        packet, _, overload = d.name.partition(".")
        backward = packet.endswith("_backward") or overload == "backward"
        found[d.name] = (d.reference, packet.removesuffix("_backward"), backward)
    return found


STAND_INS = _stand_ins()
OURS = set(STAND_INS)
FAMILIES = ("llama", "qwen2", "gemma", "gpt2")


def installed_at_cpu(op: str) -> bool:
    slot = REGISTRY.slots.get(("python_native", op, "CPU"))
    return slot is not None and any(o.dsl != TEST_DSL for o in slot.overrides)


@contextlib.contextmanager
def serving(everywhere: bool = False) -> Iterator[list[str]]:
    """Stand-ins at the CPU key for the custom ops no backend serves there (``everywhere``: for
    every custom op, behind any backend's override, for tests that switch the backends off);
    yields their names."""
    handles = []
    try:
        for op, (impl, public, backward) in STAND_INS.items():
            if everywhere or not installed_at_cpu(op):
                handles.append(pn.register_op_override(TEST_DSL, "python_native", op, "CPU", always, impl,
                                                       public_name=public, backward=backward))
        yield [h.op for h in handles]
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def aten_overrides_off() -> Iterator[None]:
    """Every override of an aten op held off: the numerical tests compare a patched model with the
    unpatched one, and spare the interpreter the aten ops no patch changes (their own tests check
    them). Held by exact name: a public name would also cover the custom ops sharing it (aten's
    ``_fused_rms_norm`` and ``python_native::rms_norm`` are both ``rms_norm``), which keep serving."""
    names = sorted({o.op for o in pn.overrides() if o.lib == "aten"} - OURS)
    token = REGISTRY.hold("op", names)
    try:
        yield
    finally:
        REGISTRY.release("op", names, token)


def _dropping(settings: dict) -> list[str]:
    return [k for k, v in settings.items() if "drop" in k and isinstance(v, float) and v]


def model(family: str, dtype: torch.dtype = torch.float32, **overrides) -> torch.nn.Module:
    """The family's tiny causal LM in training mode, where the fused loss serves (in eval mode the
    model returns its logits), with every dropout probability of its config 0 (GPT-2 has some): runs
    compare bit for bit."""
    no_dropout = dict.fromkeys(_dropping(tiny_models.config(family, **overrides).to_dict()), 0.0)
    m = tiny_models.build(family, dtype=dtype, **{**no_dropout, **overrides}).train()
    left = _dropping(m.config.to_dict()) + [n for n, d in m.named_modules() if isinstance(d, torch.nn.Dropout) and d.p]
    assert not left, f"{family}: dropout left in {left}"
    return m


def inputs(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return tiny_models.example_inputs(m, batch=2, seq=16)


def step(m: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of one training step (the gradients cleared before and after)."""
    m.zero_grad(set_to_none=True)
    loss = m(**batch).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    return loss.detach(), grads
