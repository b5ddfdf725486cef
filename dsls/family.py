"""Op families as declarations: a kernel module and, per op, one ``plan_or_why``, a layout key and an impl.

A family is what a backend's op module declares (``FAMILY = Family(...)``); everything else an
override needs follows from it, once, for every family of every backend:

- the cond (``python_native_dsls.conds``): cached per layout key, one shared fast path, returning
  the plan the impl receives as ``plan=``;
- its explanation: the reason ``plan_or_why`` gives, so the cond and what traces say of a decline
  come from one function and cannot drift;
- the kernel loader ``family.kernels()``: the kernel module imported on the first launch (never
  with the op), under ``runtime_import``, so a runtime that breaks after installation routes the
  DSL's calls to aten, warned about once and named in ``pn.status()``;
- the ``OverrideSpec``s the backend registers, with the op's public name, backward flag, variants,
  measured flag and namespace.

A backend finds its families by listing its ``ops`` package (``discover``): a new family is one
module dropped there, and no list anywhere names it.

Backend-neutral and light: no DSL import here or in what a family builds before its first launch.
"""

from __future__ import annotations

import functools
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, Any

from python_native_dsls.conds import FLOAT32, Guards, make_cond, params_of
from python_native_dsls.spec import OverrideSpec, has_kernel, runtime_import

if TYPE_CHECKING:
    from python_native_dsls.proving import BenchRow, Driver

__all__ = ["FLOAT32", "Built", "Family", "Op", "PlanOrWhy", "discover", "forget_kernels", "installable",
           "kernel_loader", "library"]

PlanOrWhy = Callable[..., Any]  # (the op's arguments) -> a plan, or a str: why the kernels decline the call


@dataclass(frozen=True)
class Op:
    """One op of a family.

    ``plan_or_why`` takes the op's arguments as the dispatcher passes them and returns the launch
    plan, or why the kernels decline the call (a str, shown by ``pn.trace()``). It must depend only
    on what ``key`` names: parameter names (a tensor stands for its sizes, strides, dtype and
    device type) and expressions over them (``"tuple(normalized_shape)"``, ``"0.0 <= p <= 1.0"``).
    ``check(plan, *args)`` adds what no key can hold (memory overlap of in-place arguments): a
    reason, or None. ``impl`` receives the plan as ``plan=``. ``bench`` names the rows of
    ``python -m python_native bench`` that reach the op; ``replayable`` is ``OverrideSpec``'s.

    What the tools need of the op is declared here too (``python_native_dsls.proving``): ``verify``,
    a forward's ``Driver`` (its cases, and the backward ops they reach), and ``bench_rows``, rows the
    benchmark (and ``inspect``, which plans its rows) measures; their names join ``bench``.

    ``nondeterministic`` says why the kernels' results can vary from run to run (atomics adding in
    no fixed order): the cond then declines under ``torch.use_deterministic_algorithms(True)``,
    unless ``deterministic_when`` (an expression over the parameters) holds for the call.
    ``scalars`` maps a scalar parameter to the tensor parameter whose dtype aten converts it to
    (every ``Scalar`` parameter is, to the first tensor's unless named here), or to ``FLOAT32``
    for a ``float`` the kernels round to float32 where aten keeps double: calls aten would refuse
    (or compute otherwise) decline, and the scalar joins the key (``python_native_dsls.scalars``).
    """

    op: str
    plan_or_why: PlanOrWhy
    impl: Callable[..., Any]
    key: tuple[str, ...]
    public_name: str | None = None
    backward: bool = False
    variants: Mapping[str, Callable[..., Any]] | None = None
    measured: bool = True
    lib: str = "aten"
    check: Callable[..., str | None] | None = None
    bench: tuple[str, ...] = ()
    replayable: bool = False  # the compiled front may replay its launches (``OverrideSpec.replayable``)
    options: Mapping[str, Any] = field(default_factory=dict)  # further registration options: derive_forms
    nondeterministic: str | None = None
    deterministic_when: str | None = None
    scalars: Mapping[str, str] = field(default_factory=dict)
    verify: Driver | None = None
    bench_rows: tuple[BenchRow, ...] = ()

    def __post_init__(self) -> None:
        declared = tuple(r.name for r in self.bench_rows if r.name not in self.bench)
        if declared:
            object.__setattr__(self, "bench", (*self.bench, *declared))


@dataclass
class Built:
    """An op as registered: its spec (cond, impl, explanation) and its plan cache."""

    op: Op
    spec: OverrideSpec
    cache: Any

    @property
    def cond(self) -> Callable[..., Any]:
        return self.spec.cond

    @property
    def explain(self) -> Callable[..., str | None]:
        return self.spec.explain

    def require(self, *args: Any, **kwargs: Any) -> Any:
        """The plan of a call, for an impl called without its cond's: ``ValueError`` saying why
        where the kernels decline the call."""
        plan = self.cond(*args, **kwargs)
        if plan is None:
            raise ValueError(f"the kernels of {self.op.lib}::{self.op.op} cannot take this call: "
                             f"{self.explain(*args, **kwargs)}")
        return plan


_loaders: dict[tuple[str, str], Any] = {}  # (dsl, module) -> its loader: families of one module share it


def kernel_loader(dsl: str, module: str) -> Callable[[], ModuleType]:
    """The loader of kernel module ``module`` (a dotted path): imported on its first call under
    ``runtime_import(dsl)`` (an import that raises makes ``dsl`` unavailable, its calls go to
    aten, and the status report says why), then returned from a cache. One loader per module."""
    found = _loaders.get((dsl, module))
    if found is not None:
        return found

    @functools.cache
    def kernels() -> ModuleType:
        with runtime_import(dsl):
            return import_module(module)

    kernels.__qualname__ = kernels.__name__ = f"kernels_{module.rpartition('.')[2]}"
    return _loaders.setdefault((dsl, module), kernels)


def forget_kernels() -> None:
    """Drop every loaded kernel module from the loaders (the next launch imports it again)."""
    for loader in _loaders.values():
        loader.cache_clear()


def installable(families: Sequence[Family], key: str, skipped: dict[str, str]) -> list[OverrideSpec]:
    """The overrides of ``families`` to install at dispatch key ``key``, each family whole or not at all:
    an override needs a kernel at ``key`` to fall back to (on CPU builds ``_fused_rms_norm_backward``
    has none, and overriding only the forward would route ``F.rms_norm``'s backward to that missing
    kernel). A family left out goes into ``skipped`` with why; plans cached before are forgotten
    (they may have been decided for another device type)."""
    specs: list[OverrideSpec] = []
    for family in families:
        family.clear_plans()
        missing = family.problem or next(
            (f"{s.lib}::{s.op} has no kernel at {key} to fall back to" for s in family.specs
             if not has_kernel(s.op, key, s.lib)), None)
        if missing is None:
            specs += family.specs
        else:
            skipped[family.name] = missing
    return specs


def discover(package: str, broken: dict[str, str]) -> list[ModuleType]:
    """The modules of ``package`` (a backend's ``ops``) that declare a ``FAMILY``, by module name, so
    that a family is found by being there. Modules named ``_*`` (shared helpers) are not listed. A
    module whose import raises is left out alone, its name and error put in ``broken`` (the backend
    reports it in the status as a family not installed), so one broken module disables only itself."""
    found = []
    for info in sorted(pkgutil.iter_modules(import_module(package).__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        try:
            module = import_module(f"{package}.{info.name}")
        except Exception as e:  # a broken op module: every other family stays installable
            broken[info.name] = f"its module {package}.{info.name} failed to import: {type(e).__name__}: {e}"
            continue
        if isinstance(getattr(module, "FAMILY", None), Family):
            found.append(module)
    return found


def library(package: str, key: str, skipped: dict[str, str]) -> list[OverrideSpec]:
    """Every override of a backend's ``ops`` package installable at dispatch key ``key``: its families
    found by ``discover``, each whole or not at all (``installable``). ``skipped`` is refilled with
    what is left out and why: broken modules and families this build cannot take."""
    skipped.clear()
    return installable([m.FAMILY for m in discover(package, skipped)], key, skipped)


def _explainer(plan_or_why: PlanOrWhy, check: Callable[..., str | None] | None,
               refusal: Callable[..., str | None]) -> Callable[..., str | None]:
    def explain(*args: Any, **kwargs: Any) -> str | None:
        refused = refusal(*args, **kwargs)
        if refused is not None:
            return refused
        found = plan_or_why(*args, **kwargs)
        if found.__class__ is str:
            return found
        if found is None:
            return "declined without a reason (its plan_or_why returned None)"
        return None if check is None else check(found, *args, **kwargs)

    return explain


class Family:
    """An op family: the ops of one kernel module, declared (see the module's docstring)."""

    def __init__(self, dsl: str, name: str, ops: Sequence[Op], *, kernels: str,
                 names: Mapping[str, Any] | None = None) -> None:
        """``kernels``: the kernel module, by name within ``python_native_dsls.<dsl>.kernels`` or by
        its dotted path; ``names``: what the ops' key expressions may name beyond their parameters."""
        self.dsl, self.name = dsl, name
        module = kernels if "." in kernels else f"python_native_dsls.{dsl}.kernels.{kernels}"
        self.kernels = kernel_loader(dsl, module)
        self.problem: str | None = None  # why the family cannot be installed here (an op this torch lacks)
        self._built: dict[str, Built] = {}
        for op in ops:
            try:
                self._built[op.op] = self._build(op, names or {})
            except ValueError as e:  # an op this torch lacks, a bad key: named with the op
                self.problem = str(e) if op.op in str(e) else f"{op.lib}::{op.op}: {e}"
                self._built.clear()
                break

    def _build(self, op: Op, names: Mapping[str, Any]) -> Built:
        params = params_of(op.lib, op.op)
        fn_name = op.op.replace(".", "_") + "_cond"
        if op.replayable and op.nondeterministic is not None:
            raise ValueError(f"{op.lib}::{op.op}: a replayable op must be deterministic (the compiled front "
                             "replays it without asking its cond)")
        guards = Guards(op.nondeterministic, op.deterministic_when, tuple(op.scalars.items()))
        cond, cache = make_cond(fn_name, params, op.key, op.plan_or_why, op.check, names, guards)
        options = dict(op.options)
        if op.variants:
            options["variants"] = dict(op.variants)
        spec = OverrideSpec.planned(op.op, cond, op.impl, measured=op.measured, public_name=op.public_name,
                                    backward=op.backward, explain=_explainer(op.plan_or_why, op.check, cond.refusal),
                                    lib=op.lib, replayable=op.replayable, **options)
        return Built(op, spec, cache)

    def __getitem__(self, op: str) -> Built:
        return self._built[op]

    def __iter__(self) -> Iterator[Built]:
        return iter(self._built.values())

    @property
    def specs(self) -> list[OverrideSpec]:
        """The overrides to register (none where ``problem`` says why not)."""
        return [b.spec for b in self._built.values()]

    def clear_plans(self) -> None:
        """Forget every cached plan (a re-registration may run on another device type)."""
        for b in self._built.values():
            b.cache.clear()

    def __repr__(self) -> str:
        return f"Family({self.dsl!r}, {self.name!r}, ops={list(self._built)})"
