"""What a backend's op library declares, and the fallback check both backends make before installing it.

Backend-neutral and light (no DSL import): the op modules of every backend list ``OverrideSpec``s,
and ``python_native.panel.dsl_support.register_specs`` installs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from python_native.foundations.launches import declare_replayable


@dataclass(frozen=True)
class OverrideSpec:
    """One override: the op symbol it replaces (in namespace ``lib``: aten's, or ``python_native``
    for an op the package declares), its cond, its impl and registration options.

    ``measured=False`` marks an override no GPU has timed against aten yet. Never slower than aten
    is the rule on GPUs, so at a GPU key it is installed only where a calibration table in force
    has evidence for it (``python_native.panel.dsl_support.unmeasured_reason``); under Triton's
    interpreter (the CPU key) it is installed as any other.

    ``public_name`` is the name a PyTorch user types for the op (``"softmax"`` for ``_softmax``
    and for its backward, ``"layer_norm"`` for ``native_layer_norm``...); ``backward`` marks the
    op as the backward of the forward declared under the same name. The panel's switches accept
    the public name and cover the forward and backward with it (see ``python_native.foundations.public_names``).

    ``explain(*args, **kwargs) -> str | None`` says why ``cond`` declines a call (``"dtype float64"``);
    traced routers ask it on a decline, never an untraced call (see ``register_op_override``).

    ``replayable=True`` declares that the cond decides from the call's key alone (dtypes, sizes,
    strides, devices, scalar arguments) and that the impl, and every variant, makes the same
    launches for one key, reads nothing back and writes device memory only through its launcher
    (``python_native.foundations.launches``): the compiled front may then serve later calls of a
    key from the launches recorded for it.
    """

    op: str
    cond: Callable[..., bool]
    impl: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)
    measured: bool = True
    lib: str = "aten"
    public_name: str | None = None
    backward: bool = False
    explain: Callable[..., str | None] | None = None
    replayable: bool = False

    def __post_init__(self) -> None:
        if self.replayable:
            for impl in (self.impl, *self.options.get("variants", {}).values()):
                declare_replayable(impl)

    @classmethod
    def planned(
        cls, op: str, cond: Callable[..., Any], impl: Callable[..., Any], *, measured: bool = True,
        public_name: str | None = None, backward: bool = False,
        explain: Callable[..., str | None] | None = None, lib: str = "aten", replayable: bool = False,
        **options: Any
    ) -> OverrideSpec:
        """An override whose cond returns its launch plan (None to decline) and whose impl takes
        it as ``plan=``: the layout work of a call is done once, in the cond. ``options`` are
        further registration options (``derive_forms``, ``priority``). Op families declare
        their overrides through ``python_native_dsls.family``, which builds these."""
        return cls(op, cond, impl, {"impl_takes_plan": True, **options}, measured, lib,
                   public_name=public_name, backward=backward, explain=explain, replayable=replayable)


def has_kernel(op: str, key: str, lib: str = "aten") -> bool:
    """Whether ``lib::op`` has a kernel at dispatch key ``key`` for an override to fall back to."""
    import torch

    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"{lib}::{op}", key)



@contextlib.contextmanager
def runtime_import(dsl: str) -> Iterator[None]:
    """Around an impl's lazy import of its kernels, which imports the DSL's runtime (triton,
    cutlass) the first time: an import that raises makes the DSL unavailable, routes its calls to
    aten from then on, records why for the status report, and hands this call on as well."""
    try:
        yield
    except Exception as e:
        from python_native.core import errors
        from python_native.panel import dsl_support

        if isinstance(e, errors.OverrideUnavailable):
            raise
        raise dsl_support.runtime_failed(dsl, e) from e
