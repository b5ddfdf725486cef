"""Helpers DSL backends share: availability without importing their runtime, installing their op
library, and taking a DSL out of routing when its runtime fails on first use."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

from python_native.core import errors, extensions
from python_native.core.registry import REGISTRY
from python_native.features import calibration
from python_native.foundations import dsl_registry, env, faults, public_names


def installed_version(distribution: str) -> Version | None:
    """Version of an installed distribution from its metadata, or None if it is absent."""
    try:
        return Version(importlib.metadata.version(distribution))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


def module_importable(module: str) -> bool:
    """Whether ``module`` could be imported, found without executing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def version_problem(name: str, version: Version, minimum: Version) -> str | None:
    """Why ``version`` fails the gate (``>= minimum``), or None when it passes or gates are skipped."""
    if version >= minimum or env.skip_version_check():
        return None
    return (
        f"{name} {version} is outside the supported range (>= {minimum}); "
        f"set {env.SKIP_VERSION_CHECK[0]}=1 to skip this check"
    )


def install_problem(distribution: str, module: str, minimum: Version) -> str | None:
    """Why ``distribution`` cannot be used (absent, or older than ``minimum``), or None."""
    version = installed_version(distribution)
    if version is None or not module_importable(module):
        return f"{distribution} not installed"
    return version_problem(distribution, version, minimum)


def unmeasured_reason(op: str, dsl: str, dispatch_key: str) -> str | None:
    """Why an override marked unmeasured (no GPU has timed it against aten) stays out at
    ``dispatch_key``; None where it may be installed.

    The never-slower rule for new ops: at a GPU key the override needs evidence, a calibration
    source (a table, or the portable policy from the shipped tables) speaking for it on every
    device the key serves (``calibration.has_evidence``); until then aten keeps the op. Under
    Triton's interpreter (the CPU key) speed is not in question. ``PYTHON_NATIVE_UNMEASURED=1``
    installs it anyway, to calibrate or test it.
    """
    if dispatch_key == "CPU" or env.unmeasured_allowed() or calibration.has_evidence(op, dsl, dispatch_key):
        return None
    return (
        "not yet timed against aten on a GPU: no calibration table (nor the portable policy) speaks for it on "
        f"this machine's GPUs, so aten keeps the op here (set {env.UNMEASURED[0]}=1 to install it, e.g. to "
        "calibrate it with bench --calibrate)"
    )


# (dsl, dispatch key) -> (op -> spec left out as unmeasured there, the backend's ``skipped``): kept so
# that ``install_held`` can install them once something will time them on first use.
_held: dict[tuple[str, str], tuple[dict[str, Any], dict[str, str] | None]] = {}


def register_specs(dsl: str, dispatch_key: str, specs: Iterable[Any], skipped: dict[str, str] | None = None) -> list:
    """Install a backend's op library (``OverrideSpec``s: ``op``, ``cond``, ``impl``, ``options``,
    ``measured``, the ``public_name`` users type for the op, which the panel's switches then accept, and
    the ``explain`` traces ask why the cond declined a call).

    Ops slower than aten at every size on every device this key serves are left out (a
    calibration table or the portable policy gates the conds of the rest where it can speak for
    them: see ``calibration.gate_override``); the status report names them. So are ops marked
    unmeasured where nothing has timed them (``unmeasured_reason``), each recorded in ``skipped``
    with why (the backend's ``skipped_overrides()``), and kept for ``install_held``. One op that
    cannot be installed here never costs the others.
    """
    log = logging.getLogger("python_native")
    handles = []
    specs = list(specs)
    held: dict[str, Any] = {}
    _held[(dsl, dispatch_key)] = (held, skipped)
    calibration.declare_kernels(dsl, [(spec.op, spec.impl) for spec in specs])  # their tables' rows stay fresh until these change
    for spec in specs:
        lib = getattr(spec, "lib", "aten")
        public_name = getattr(spec, "public_name", None)
        if public_name is not None:  # declared whether or not it installs: the name stays known
            public_names.declare(public_name, spec.op, backward=getattr(spec, "backward", False))
        why = None if getattr(spec, "measured", True) else unmeasured_reason(spec.op, dsl, dispatch_key)
        if why is not None:
            if skipped is not None:
                skipped[spec.op] = why
            held[spec.op] = spec
            log.info("python_native: %s %s left out: %s", dsl, spec.op, why)
            continue
        why = calibration.leave_out(spec.op, dsl, dispatch_key)
        if why is not None:
            log.info("python_native: %s %s::%s left out: %s", dsl, lib, spec.op, why)
            continue
        try:
            handles.append(_register(dsl, dispatch_key, spec))
        except Exception:
            log.exception("python_native: %s override of %s::%s not installed", dsl, lib, spec.op)
            continue
        log.debug("python_native: %s override of %s::%s installed at %s", dsl, lib, spec.op, dispatch_key)
    return handles


def _register(dsl: str, dispatch_key: str, spec: Any) -> Any:
    return REGISTRY.register(dsl, getattr(spec, "lib", "aten"), spec.op, dispatch_key, spec.cond, spec.impl,
                             explain=getattr(spec, "explain", None), **spec.options)


def install_held(ops: tuple[str, ...], dispatch_key: str) -> list[str]:
    """Install the overrides of ``ops`` that ``register_specs`` left out at ``dispatch_key`` as
    unmeasured, now that they will be timed on first use (``pn.patch`` of a model on a GPU asks;
    the calibration gate then lets each serve only where it measured faster). All or nothing: one
    that fails to install takes the others out again and raises, so the registry and dispatcher
    stay as they were. Each is installed once (then no longer held, nor named as left out).
    Returns ``"<dsl> <op>"`` for each installed."""
    wanted = set(ops)
    with REGISTRY.lock:
        picked = [(dsl, spec) for (dsl, key), (held, _) in _held.items() if key == dispatch_key
                  for op, spec in held.items() if op in wanted and calibration.leave_out(op, dsl, key) is None]
        handles: list[Any] = []
        try:
            for dsl, spec in picked:
                handles.append(_register(dsl, dispatch_key, spec))
        except BaseException:
            for handle in reversed(handles):
                REGISTRY.remove(handle)
            raise
        for dsl, spec in picked:
            held, skipped = _held[(dsl, dispatch_key)]
            del held[spec.op]
            if skipped is not None:
                skipped.pop(spec.op, None)
    for dsl, spec in picked:
        logging.getLogger("python_native").info(
            "python_native: %s override of %s installed at %s, to be timed on first use", dsl, spec.op, dispatch_key)
    return [f"{dsl} {spec.op}" for dsl, spec in picked]


extensions.register(extensions.Hooks("held overrides", install_held=install_held))


def runtime_failed(dsl: str, error: BaseException) -> errors.OverrideUnavailable:
    """``dsl``'s runtime raised when first imported (at its first kernel call, since runtimes load
    lazily): make the DSL unavailable, route its slots around it (aten, or the next override,
    serves its calls from now on) and record why for the status report.

    Returns the exception the failing impl raises (``raise runtime_failed(...) from error``), so
    that the router hands the very call that found the failure on too.
    """
    reason = f"its runtime failed to import: {type(error).__name__}: {error}"
    if dsl_registry.record_runtime_failure(dsl, reason):
        with REGISTRY.lock:
            REGISTRY.unroutable_dsls.add(dsl)
            REGISTRY.refresh_all()
        faults.report(
            dsl, reason, "reinstall or repair it; aten serves the calls of its overrides meanwhile", stacklevel=3
        )
    return errors.OverrideUnavailable(f"{dsl}: {dsl_registry.runtime_failure(dsl)}")
