"""Probing: run a module and a candidate replacement on a small input and compare them bit for bit.

Matchers confirm a replacement numerically rather than trusting names: the module's own forward
and the candidate see the same random probe and must agree exactly (dtype, shape, every bit).
``session()`` holds every DSL off while matchers run (aten's kernels and the custom ops'
references only: what a patched model computes with the DSLs off), without gradients, with the
random number generators forked (a probe never moves the user's random stream: torch's, Python's
``random``, numpy's where loaded) and warnings muted. ``preserved(model)`` puts back what a probe
could leave on the model (attributes, buffers, gradients, the ``training`` flags). While
``refusing(why)`` is open (a target whose forward has side effects), ``attempt`` runs nothing and
raises ``Refused``: the installer reports the target left alone, without having run it. Where
DTensor is loaded, ``session()`` first registers the sharding strategies of the ops that take
DTensors (a tensor-parallel model may hand them some).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import pkgutil
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from importlib import import_module
from types import ModuleType
from typing import Any

import torch
from torch import nn

from python_native import ops
from python_native.core.registry import REGISTRY
from python_native.foundations import dsl_registry

SEED = 20240613
log = logging.getLogger("python_native")


class Refused(Exception):
    """A probe asked to run a target whose forward has side effects (``refusing``)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_refusal = threading.local()


@contextlib.contextmanager
def refusing(reason: str | None) -> Iterator[None]:
    """While open (``reason`` not None), ``attempt`` raises ``Refused(reason)`` instead of running."""
    previous = getattr(_refusal, "reason", None)
    _refusal.reason = reason
    try:
        yield
    finally:
        _refusal.reason = previous


@functools.cache
def _sharded_ops() -> list[ModuleType]:
    """The custom op modules that declare DTensor sharding strategies, found by listing ``python_native.ops``."""
    modules = [import_module(f"{ops.__name__}.{info.name}") for info in pkgutil.iter_modules(ops.__path__)]
    return [m for m in modules if hasattr(m, "register_dtensor_sharding")]


@contextlib.contextmanager
def session(devices: list[int] | None = None) -> Iterator[None]:
    """Matchers run inside: every DSL off, no grad, forked RNG, warnings muted."""
    if "torch.distributed.tensor" in sys.modules:  # a model may hand the ops DTensors
        for op in _sharded_ops():
            op.register_dtensor_sharding()
    names = list(dsl_registry.names())
    token = REGISTRY.hold("dsl", names)
    py_state = random.getstate()
    numpy = sys.modules.get("numpy")
    np_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices or []), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        random.setstate(py_state)
        if np_state is not None:
            numpy.random.set_state(np_state)
        REGISTRY.release("dsl", names, token)


def _shallow(module: nn.Module) -> dict[str, Any]:
    """A module's attributes, its dicts (parameters, buffers, children, hooks) copied one level."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(module).items()}


def _put_back(module: nn.Module, saved: dict[str, Any]) -> None:
    attrs = vars(module)
    for key in [k for k in attrs if k not in saved]:
        del attrs[key]
    for key, value in saved.items():
        current = attrs.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            if list(current) != list(value) or any(current[k] is not v for k, v in value.items()):
                current.clear()
                current.update(value)
        elif current is not value:
            attrs[key] = value


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that FSDP2's ``fully_shard`` took (none where FSDP was never loaded)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    return [] if kind is None else [m for m in model.modules() if isinstance(m, kind)]


def _is_fsdp_hook(hook: Any) -> bool:
    return (getattr(getattr(hook, "__func__", hook), "__module__", None) or "").startswith("torch.distributed.fsdp")


@contextlib.contextmanager
def _gathered(model: nn.Module) -> Iterator[None]:
    """Probes of an FSDP2-sharded model see its parameters whole, as its forward does: every group is
    unsharded (an all-gather per group, in module order, the same on every rank: each rank patches the
    same model) and FSDP's forward hooks are held back, so a probe that calls a submodule neither
    reshards it nor starts FSDP's root state from the wrong module. Resharded after. This holds the
    whole model on each rank while the rules match; patching before ``fully_shard`` does not."""
    sharded = _fsdp_modules(model)
    hidden = [(hooks, dict(hooks)) for m in sharded for hooks in (m._forward_pre_hooks, m._forward_hooks)]
    try:
        for m in sharded:
            m.unshard()
        for hooks, everything in hidden:
            for key in [k for k, hook in everything.items() if _is_fsdp_hook(hook)]:
                del hooks[key]
        yield
    finally:
        for hooks, everything in hidden:  # in their order: FSDP's pre-forward hook runs first
            hooks.clear()
            hooks.update(everything)
        for m in sharded:
            m.reshard()


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Whatever probes do to ``model`` is undone after: every module's attributes (the ``training``
    flag, plain values, which tensors it holds), buffers' values, parameters' ``grad`` and
    ``requires_grad``. A parameter changed in place cannot be put back (no copy is kept): warned.
    An FSDP2-sharded model is probed with its parameters gathered (``_gathered``)."""
    with _gathered(model), _kept(model):
        yield


@contextlib.contextmanager
def _kept(model: nn.Module) -> Iterator[None]:
    modules = list(model.modules())
    saved = [(m, _shallow(m)) for m in modules]
    buffers = [(b, b._version, b.detach().clone()) for m in modules for b in m._buffers.values() if b is not None]
    params = [(p, p._version, p.grad, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for m, attrs in saved:
            _put_back(m, attrs)
        with torch.no_grad():
            for b, version, value in buffers:
                if b._version != version:
                    b.copy_(value)
        for p, version, grad, requires_grad in params:
            if p.grad is not grad:
                p.grad = grad
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
            if p._version != version:
                log.warning("python_native: a patch probe changed a parameter of shape %s in place; it cannot be "
                            "put back", tuple(p.shape))


def randn(*shape: int, dtype: torch.dtype = torch.float32, device: Any = "cpu", scale: float = 1.0,
          seed: int = SEED) -> torch.Tensor:
    """A reproducible normal probe (drawn on the CPU, whatever the target device)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def same(a: Any, b: Any) -> bool:
    """Bit for bit: tensors of one dtype and shape with equal elements, or tuples of them."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    return False


def close(a: Any, b: Any, rtol: float = 1e-3, atol: float = 1e-3) -> bool:
    """Near enough to say what a module computes, though not bit for bit (the report's near misses)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(close(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    return False


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or None where it raises (a candidate that cannot take the probe);
    ``Refused`` while ``refusing`` is open, without running it."""
    reason = getattr(_refusal, "reason", None)
    if reason is not None:
        raise Refused(reason)
    try:
        return fn(*args, **kwargs)
    except Exception:
        return None


def seeded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Exception | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, what it raised)``, run from one random state
    (torch's generator, and that of each CUDA device the tensor arguments are on, seeded alike), so
    a forward and its candidate draw the same dropout masks; ``Refused`` as ``attempt``. ``session()``
    puts the random state back."""
    reason = getattr(_refusal, "reason", None)
    if reason is not None:
        raise Refused(reason)
    torch.default_generator.manual_seed(SEED)
    for device in {a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}:
        with torch.cuda.device(device):  # forked by ``session`` (the model's CUDA devices)
            torch.cuda.manual_seed(SEED)
    try:
        return fn(*args, **kwargs), None
    except Exception as e:
        return None, e


def with_random_parameters(module: nn.Module, center: float = 1.0) -> nn.Module:
    """A shallow copy of ``module`` whose own parameters are random (``center`` plus noise), so a
    probe tells apart forwards that a weight of ones or zeros would make agree."""
    twin = copy.copy(module)
    twin._parameters = {
        name: None if p is None else nn.Parameter(
            center + randn(*p.shape, dtype=torch.float32, device=p.device, scale=0.5, seed=SEED + i).to(p.dtype),
            requires_grad=False)
        for i, (name, p) in enumerate(module._parameters.items())
    }
    twin.__dict__.pop("forward", None)
    return twin


def one_tensor_forward(module: nn.Module) -> bool:
    """Whether the class's forward takes one required argument (the others have defaults)."""
    try:
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1


def torch_module(module: nn.Module) -> bool:
    """Whether the class's forward is torch's own: it calls aten ops that the overrides serve as they stand."""
    return type(module).forward.__module__.startswith("torch.")


def is_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters(recurse=True))
