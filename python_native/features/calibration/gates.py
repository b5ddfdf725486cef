"""The gate around an override's cond: it declines where the device's verdict says aten is faster.

The dispatch core applies ``gate_override`` to every override it commits (``extensions.wrap_conds``),
which wraps a cond only where a table or the portable policy can speak for that override at its
key; elsewhere the cond is bound as it is and costs nothing extra. Ops that lose everywhere on
this machine are not installed at all (``leave_out``, asked by ``dsl_support.register_specs``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from python_native.core.registry import REGISTRY
from python_native.features.calibration import resolve, tables

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

_UNRESOLVED = object()
_suspended = False  # True while `bench --calibrate` measures: every gate lets the override run
# Every live gate, whose resolved verdicts reset() empties; weak, so a removed override's gate goes with it.
_gates: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
# op -> {dsl -> its own cond}: the gated overrides of each op, so a gate can ask whether a faster rival serves.
_gated_conds: dict[str, dict[str, Callable[..., bool]]] = {}
_left_out: dict[str, dict[str, dict[str, str]]] = {}  # dispatch key -> dsl -> op -> why
_dtype_names: tuple[str, ...] | None = None


def dtype_names() -> tuple[str, ...]:
    """Every torch dtype's name (``"float32"``, ...): the dtypes a gate can be asked about."""
    global _dtype_names
    if _dtype_names is None:
        import torch

        _dtype_names = tuple(sorted({str(v).removeprefix("torch.") for v in vars(torch).values()
                                     if isinstance(v, torch.dtype)}))
    return _dtype_names


def _resolve(op: str, dsl: str, t: Any) -> tables.Verdicts | None:
    """The per-bucket verdicts of ``dsl``'s ``op`` for ``t``'s device and dtype; None where nothing speaks."""
    key = resolve.device_key(t.device)
    return resolve.resolution(key).verdicts(dsl, op, str(t.dtype).removeprefix("torch."))


def _mask(verdicts: tables.Verdicts, wide: int) -> int:
    return sum(1 << b for b in range(64) if verdicts[2 * b + wide] is False)


def gated(
    op: str, cond: Callable[..., Any], dsl: str = tables.DEFAULT_DSL, explain: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """``dsl``'s ``cond`` that also declines where the device's verdict says the override loses to
    aten, or where another DSL gated on the same op is calibrated faster there and would serve the
    call (it is switched on and installed here, and its own cond accepts).

    Per call, before the cond: two dict reads (dtype, then device index) that hold the op's
    verdicts for that dtype and device once resolved, and a tuple index by size bucket and width
    class; the cond runs only where the verdict does not decline. Only where a faster rival
    exists: a set lookup of its DSL switch, and its cond. Where it accepts it returns the cond's
    own result, so a plan a cond hands to its impl (``impl_takes_plan``) passes through the gate.

    The gate offers ``decline_masks(device_key)``: per dtype name, (narrow, wide) bit masks of the
    size buckets 0..63 where it surely declines, whatever the cond says (None: nothing known).

    Its ``explain`` (asked by traced routers only, on a decline) names calibration where the gate
    declined and defers to ``explain`` (the override's own) where the cond did.
    """
    import torch

    tensor_type = torch.Tensor
    dsl_off = REGISTRY.switches.dsl.off  # the live set the switches keep up to date
    unroutable = REGISTRY.unroutable_dsls
    rivals = _gated_conds.setdefault(op, {})
    rivals[dsl] = getattr(cond, "__wrapped__", cond)
    resolved: dict[Any, dict[int, Any]] = {}  # dtype -> device index (-1: CPU) -> verdicts

    def calibrated_cond(*args: Any, **kwargs: Any) -> Any:
        # The verdict first: where the override loses (small, host-bound calls, mostly) the call
        # then declines without running the cond at all.
        t = args[0] if args and isinstance(args[0], tensor_type) else next(
            (a for a in args if isinstance(a, tensor_type)), None
        )
        if t is None or _suspended:
            return cond(*args, **kwargs)
        by_device = resolved.get(t.dtype)
        if by_device is None:
            by_device = resolved.setdefault(t.dtype, {})
        index = t.get_device()
        verdicts = by_device.get(index, _UNRESOLVED)
        if verdicts is _UNRESOLVED:
            verdicts = by_device[index] = _resolve(op, dsl, t)
        if verdicts is None:
            return cond(*args, **kwargs)
        verdict = verdicts[2 * min(t.numel().bit_length(), tables.MAX_BUCKET) + (
            1 if t.ndim and t.shape[-1] >= tables.WIDE_ROW else 0)]
        if verdict is False:
            return False
        accepted = cond(*args, **kwargs)  # the cond's own result: a plan, where the impl takes one
        if not accepted:
            return False
        for rival in verdict:  # empty unless another DSL is calibrated faster for this bucket
            if rival in dsl_off or rival in unroutable:
                continue
            rival_cond = rivals.get(rival)
            if rival_cond is not None and rival_cond(*args, **kwargs):
                return False
        return accepted

    def explain_decline(*args: Any, **kwargs: Any) -> str | None:
        t = next((a for a in args if isinstance(a, tensor_type)), None)
        verdicts = None if t is None or _suspended else resolved.get(t.dtype, {}).get(t.get_device())
        verdict = None if not verdicts else verdicts[2 * min(t.numel().bit_length(), tables.MAX_BUCKET) + (
            1 if t.ndim and t.shape[-1] >= tables.WIDE_ROW else 0)]
        if verdict is False:
            return f"calibration: aten is faster for {_call_text(t)} on {resolve.device_key(t.device)}"
        if verdict is not None and cond(*args, **kwargs):
            faster = [r for r in verdict if r not in dsl_off and r not in unroutable]
            return f"calibration: {' or '.join(faster) or 'another DSL'} is faster for {_call_text(t)} and serves it"
        return explain(*args, **kwargs) if explain is not None else None

    def decline_masks(device_key: str) -> dict[str, tuple[int, int]] | None:
        if _suspended:
            return None
        found = resolve.resolution(device_key)
        masks = {}
        for name in dtype_names():
            verdicts = found.verdicts(dsl, op, name)
            if verdicts is not None:
                masks[name] = (_mask(verdicts, 0), _mask(verdicts, 1))
        return masks or None

    calibrated_cond.__name__ = f"calibrated_{getattr(cond, '__name__', 'cond')}"
    calibrated_cond.__wrapped__ = cond  # type: ignore[attr-defined]
    calibrated_cond.calibrated_dsl = dsl  # type: ignore[attr-defined]
    calibrated_cond.calibrated_op = op  # type: ignore[attr-defined]
    calibrated_cond.decline_masks = decline_masks  # type: ignore[attr-defined]
    calibrated_cond.explain = explain_decline  # type: ignore[attr-defined]
    calibrated_cond.resolved = resolved  # type: ignore[attr-defined]
    _gates.add(calibrated_cond)
    return calibrated_cond


def _call_text(t: Any) -> str:
    """A call as its verdict sees it: ``"float32 inputs of 1024 elements (rows of width 64)"``."""
    width = f" (rows of width {t.shape[-1]})" if t.ndim else ""
    return f"{str(t.dtype).removeprefix('torch.')} inputs of {t.numel()} elements{width}"


def forget_gate(op: str, dsl: str) -> None:
    """Stop counting ``dsl`` as a rival on ``op`` (its override was removed)."""
    _gated_conds.get(op, {}).pop(dsl, None)


def is_gated(cond: Any) -> bool:
    """Whether ``cond`` is a calibration gate."""
    return hasattr(cond, "calibrated_dsl")


def could_gate(dispatch_key: str, dsl: str, op: str) -> bool:
    """Whether a table or the portable policy speaks for ``dsl``'s ``op`` on a device ``dispatch_key`` serves."""
    _fresh()
    return any(r.speaks_for(dsl, op) for r in resolve.devices_at(dispatch_key))


def gates_needed(dispatch_key: str) -> bool:
    """Whether any override installed at ``dispatch_key`` could be gated (some source speaks for a device there)."""
    _fresh()
    return any(r.ops() for r in resolve.devices_at(dispatch_key))


def gate_override(handle: OverrideHandle, cond: Callable[..., Any]) -> Callable[..., Any]:
    """The dispatch core's cond wrapper: ``cond`` gated where a table or the portable policy can
    speak for the override at its key, ``cond`` itself elsewhere (it then costs nothing).

    Derived in-place/``out=`` variants are gated by their functional op's verdicts. A cond gated
    already (``gated`` called by hand) is left as it is. Never raises: a failure to tell leaves
    the cond ungated, as without calibration.
    """
    op = handle.functional.op
    try:
        needed = not is_gated(cond) and could_gate(handle.dispatch_key, handle.dsl, op)
    except Exception:
        import logging

        logging.getLogger("python_native").exception("python_native: calibration could not gate %s %s", handle.dsl, op)
        return cond
    return gated(op, cond, handle.dsl, getattr(handle, "explain", None)) if needed else cond


def forget_removed(handle: OverrideHandle) -> None:
    """The core's removal listener: a removed override's gate is no rival any more."""
    if is_gated(handle.routed_cond):
        forget_gate(handle.routed_cond.calibrated_op, handle.routed_cond.calibrated_dsl)


def never_wins(op: str, dsl: str = tables.DEFAULT_DSL, dispatch_key: str = "CUDA") -> bool:
    """True when ``dsl``'s ``op`` loses to aten everywhere on every device ``dispatch_key`` serves:
    each device's sources speak for it and none has a (dtype, size, width) where it fires.
    Unknown devices (no NVML) count as every device a table is for plus any other GPU."""
    _fresh()
    found = resolve.devices_at(dispatch_key)
    return bool(found) and all(r.never_wins(dsl, op) for r in found)


def has_evidence(op: str, dsl: str, dispatch_key: str = "CUDA") -> bool:
    """Whether a table or the portable policy speaks for ``dsl``'s ``op`` on every device
    ``dispatch_key`` serves: some GPU has timed it (what an override marked unmeasured waits for).
    Never raises: a failure to tell counts as no evidence."""
    try:
        _fresh()
        found = resolve.devices_at(dispatch_key)
        return bool(found) and all(r.speaks_for(dsl, op) for r in found)
    except Exception:
        return False


def leave_out(op: str, dsl: str, dispatch_key: str) -> str | None:
    """Why ``dsl``'s ``op`` should not be installed at ``dispatch_key`` (it never wins on any device
    there), recorded for the status report; None to install it. Never raises."""
    try:
        if not never_wins(op, dsl, dispatch_key):
            return None
        devices = ", ".join(r.device for r in resolve.devices_at(dispatch_key))
    except Exception:
        import logging

        logging.getLogger("python_native").exception("python_native: calibration could not judge %s %s", dsl, op)
        return None
    why = f"slower than aten at every size on {devices}"
    _left_out.setdefault(dispatch_key, {}).setdefault(dsl, {})[op] = why
    return why


def left_out() -> dict[str, dict[str, dict[str, str]]]:
    """Per dispatch key, per DSL: the ops left out at registration and why."""
    return {key: {dsl: dict(ops) for dsl, ops in per.items()} for key, per in _left_out.items()}


def gated_dsls(op: str) -> list[str]:
    """The DSLs whose overrides of ``op`` carry a calibrated gate (for the status report)."""
    return sorted(_gated_conds.get(op, {}))


def reset() -> None:
    """Forget every table, resolution and resolved verdict; re-select the routers."""
    resolve.forget()
    for gate in list(_gates):
        gate.resolved.clear()
    refresh()


def _fresh() -> None:
    """Start over where ``PYTHON_NATIVE_CALIBRATION`` changed since the tables were read."""
    if resolve.stale():
        reset()


def refresh() -> None:
    """Re-select every router, so that a compiled front re-reads the gates' decline masks."""
    with REGISTRY.lock:
        REGISTRY.refresh_all()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Gates answer "uncalibrated" inside: calibration measures overrides the current table turns off."""
    global _suspended
    previous, _suspended = _suspended, True
    refresh()
    try:
        yield
    finally:
        _suspended = previous
        refresh()
