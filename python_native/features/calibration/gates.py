"""The gate around an override's cond: it declines where the device's verdict says aten is faster.

The dispatch core applies ``gate_override`` to every override it commits (its ``wrap_cond`` hook),
which wraps a cond in a ``Gate`` only where a table or the portable policy can speak for that
override at its key, or ``pn.benchmark`` will measure it there; elsewhere the cond is bound as it
is and costs nothing extra. Ops that lose everywhere on this machine are not installed at all
(``leave_out``, asked by ``dsl_support.register_specs``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import TYPE_CHECKING, Any

from python_native.core.registry import REGISTRY
from python_native.features.calibration import first_use, resolve, tables

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle

_UNRESOLVED = object()
_suspended = False  # True while `bench --calibrate` measures: every gate lets the override run
# Every live gate, whose resolved verdicts reset() empties; weak, so a removed override's gate goes with it.
_gates: weakref.WeakSet[Gate] = weakref.WeakSet()
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


def _mask(verdicts: tables.Verdicts, wide: int) -> int:
    return sum(1 << b for b in range(64) if verdicts[2 * b + wide] is False)


class Gate:
    """``dsl``'s ``cond`` that also declines where the device's verdict says the override loses to
    aten, or where another DSL gated on the same op is calibrated faster there and would serve the
    call (it is switched on and installed here, and its own cond accepts).

    ``cond`` (the attribute) is what the router calls: a plain function, built once per gate. Per
    call, before the wrapped cond: two dict reads (dtype, then device index) that hold the op's
    verdicts for that dtype and device once resolved, and a tuple index by ``tables.cell_of``
    (its expression inlined, with its constants);
    the wrapped cond runs only where the verdict does not decline. Only where a faster rival
    exists: a set lookup of its DSL switch, and its cond. Where it accepts it returns the cond's
    own result, so a plan a cond hands to its impl (``impl_takes_plan``) passes through the gate.
    A cell ``pn.benchmark`` is to measure carries ``first_use.MEASURE`` among the rivals: the
    first call there is handed to ``measure.decide`` (see ``first_use``), at no cost elsewhere.

    ``decline_masks(device_key)``: per dtype name, (narrow, wide) bit masks of the size buckets
    0..63 where it surely declines, whatever the cond says (None: nothing known); a compiled front
    reads them (``extensions.CallGates``). ``explain`` (asked by traced routers only, on a
    decline) names calibration where the gate declined and defers to the override's own where the
    cond did. Calling the gate calls ``cond``.
    """

    def __init__(self, op: str, cond: Callable[..., Any], dsl: str = tables.DEFAULT_DSL,
                 explain: Callable[..., Any] | None = None, handle: OverrideHandle | None = None):
        self.op, self.dsl, self.__wrapped__, self.own_explain = op, dsl, cond, explain
        self.owner = handle  # dropped when the override is removed
        self.resolved: dict[Any, dict[int, Any]] = {}  # dtype -> device index (-1: CPU) -> verdicts
        self.rivals = _gated_conds.setdefault(op, {})
        self.rivals[dsl] = getattr(cond, "__wrapped__", cond)
        self.cond = self._routed(cond)
        _gates.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cond(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<calibration gate of {self.dsl} {self.op}>"

    def handle(self) -> OverrideHandle | None:
        """The override this gate is the cond of (None: a gate built by hand and not registered, or
        removed: it never measures)."""
        return self.owner

    def _routed(self, cond: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        tensor_type, mark, resolved, rivals = torch.Tensor, first_use.MARK, self.resolved, self.rivals
        top, wide_row = tables.MAX_BUCKET, tables.WIDE_ROW
        dsl_off = REGISTRY.switches.dsl.off  # the live set the switches keep up to date
        unroutable, verdicts_for, measured = REGISTRY.unroutable_dsls, self.verdicts_for, self._measured

        def calibrated_cond(*args: Any, **kwargs: Any) -> Any:
            # The verdict first: where the override loses (small, host-bound calls, mostly) the call
            # then declines without running the cond at all.
            t = args[0] if args and isinstance(args[0], tensor_type) else next(
                (a for a in args if isinstance(a, tensor_type)), None
            )
            if t is None or _suspended:
                return cond(*args, **kwargs)
            by_device = resolved.get(t.dtype)
            verdicts = by_device.get(t.get_device(), _UNRESOLVED) if by_device is not None else _UNRESOLVED
            if verdicts is _UNRESOLVED:
                verdicts = verdicts_for(t)
            if verdicts is None:
                return cond(*args, **kwargs)
            # tables.cell_of, written out: a call here costs ~40 ns a gated call would pay every time.
            verdict = verdicts[2 * min(t.numel().bit_length(), top) + (1 if t.ndim and t.shape[-1] >= wide_row else 0)]
            if verdict is False:
                return False
            accepted = cond(*args, **kwargs)  # the cond's own result: a plan, where the impl takes one
            if not accepted:
                return False
            for rival in verdict:  # empty unless another DSL is calibrated faster for this bucket
                if rival is mark:  # or this call's cell is to be measured on first use
                    return measured(t, args, kwargs, accepted)
                if rival in dsl_off or rival in unroutable:
                    continue
                rival_cond = rivals.get(rival)
                if rival_cond is not None and rival_cond(*args, **kwargs):
                    return False
            return accepted

        calibrated_cond.__name__ = f"calibrated_{getattr(cond, '__name__', 'cond')}"
        calibrated_cond.__wrapped__ = cond  # type: ignore[attr-defined]
        calibrated_cond.explain = self.explain  # type: ignore[attr-defined]  (a cond's explanation, as for any cond)
        calibrated_cond._python_native_gate = self  # type: ignore[attr-defined]  (gate_of finds it)
        return calibrated_cond

    def verdicts_for(self, t: Any) -> tables.Verdicts | None:
        """The per-cell verdicts for ``t``'s dtype and device, resolved once and kept (None: nothing speaks)."""
        key = resolve.device_key(t.device)
        found = resolve.resolution(key).verdicts(self.dsl, self.op, str(t.dtype).removeprefix("torch."))
        self.resolved.setdefault(t.dtype, {})[t.get_device()] = found
        return found

    def _measured(self, t: Any, args: tuple, kwargs: dict, accepted: Any) -> Any:
        from python_native.features.calibration import measure  # loaded once pn.benchmark first measures

        return measure.decide(self, t, args, kwargs, accepted)

    def relearn(self, dtype: Any) -> None:
        """A verdict of this op was learned for ``dtype``: every gate of the op reads its verdicts
        again, and their slots are refreshed (a compiled front takes the new masks at once)."""
        slots = []
        for gate in list(_gates):
            if gate.op == self.op and gate.dsl == self.dsl:
                gate.resolved.pop(dtype, None)
                handle = gate.handle()
                if handle is not None and handle.slot is not None:
                    slots.append(handle.slot)
        with REGISTRY.lock:
            for slot in dict.fromkeys(slots):
                REGISTRY.refresh(slot)

    def explain(self, *args: Any, **kwargs: Any) -> str | None:
        import torch

        t = next((a for a in args if isinstance(a, torch.Tensor)), None)
        verdicts = None if t is None or _suspended else self.verdicts_for(t)
        verdict = None if not verdicts else verdicts[tables.cell_of(t)]
        if verdict is False:
            return f"calibration: aten is faster for {_call_text(t)} on {resolve.device_key(t.device)}"
        if verdict is not None and self.__wrapped__(*args, **kwargs):
            faster = [r for r in verdict if r is not first_use.MARK and r not in REGISTRY.switches.dsl.off
                      and r not in REGISTRY.unroutable_dsls]
            return f"calibration: {' or '.join(faster) or 'another DSL'} is faster for {_call_text(t)} and serves it"
        return self.own_explain(*args, **kwargs) if self.own_explain is not None else None

    def decline_masks(self, device_key: str) -> dict[str, tuple[int, int]] | None:
        """Per dtype name, (narrow, wide) masks of the size buckets where this gate surely declines."""
        if _suspended:
            return None
        found = resolve.resolution(device_key)
        masks = {}
        for name in dtype_names():
            verdicts = found.verdicts(self.dsl, self.op, name)
            if verdicts is not None:
                masks[name] = (_mask(verdicts, 0), _mask(verdicts, 1))
        return masks or None


gated = Gate  # the name the package's API has always had for it


def gate_of(cond: Any) -> Gate | None:
    """The gate ``cond`` is (a ``Gate``, or the function a gate hands the router), else None.

    Asked on every refresh of a slot (a compiled front's decision): a plain function's attributes
    are read from its ``__dict__``, without the exception a missing one raises inside ``getattr``."""
    if type(cond) is FunctionType:
        found = cond.__dict__.get("_python_native_gate")
    elif isinstance(cond, Gate):
        return cond
    else:
        found = getattr(cond, "_python_native_gate", None)
    return found if isinstance(found, Gate) else None


def _call_text(t: Any) -> str:
    """A call as its verdict sees it: ``"float32 inputs of 1024 elements (rows of width 64)"``."""
    width = f" (rows of width {t.shape[-1]})" if t.ndim else ""
    return f"{str(t.dtype).removeprefix('torch.')} inputs of {t.numel()} elements{width}"


def forget_gate(op: str, dsl: str) -> None:
    """Stop counting ``dsl`` as a rival on ``op`` (its override was removed)."""
    _gated_conds.get(op, {}).pop(dsl, None)


def is_gated(cond: Any) -> bool:
    """Whether ``cond`` is a calibration gate (or the function one hands the router)."""
    return gate_of(cond) is not None


def could_gate(dispatch_key: str, dsl: str, op: str) -> bool:
    """Whether a table or the portable policy speaks for ``dsl``'s ``op`` on a device ``dispatch_key``
    serves, or ``pn.benchmark`` measures there."""
    _reset_if_setting_changed()
    return any(r.speaks_for(dsl, op) for r in resolve.devices_at(dispatch_key))


def gates_needed(dispatch_key: str) -> bool:
    """Whether any override installed at ``dispatch_key`` could be gated (some source speaks for a device there)."""
    _reset_if_setting_changed()
    return any(r.ops() for r in resolve.devices_at(dispatch_key))


def gate_override(handle: OverrideHandle, cond: Callable[..., Any]) -> Callable[..., Any]:
    """The dispatch core's cond wrapper: ``cond`` gated where a table or the portable policy can
    speak for the override at its key, ``cond`` itself elsewhere (it then costs nothing).

    Derived in-place/``out=`` forms are gated by their functional op's verdicts. A cond gated
    already (a ``Gate`` built by hand) is bound as its function. Never raises: a failure to tell
    leaves the cond ungated, as without calibration.
    """
    op = handle.functional.op
    found = gate_of(cond)
    if found is not None:
        if found.owner is None:  # built by hand: it measures for this override from now on
            found.owner = handle
        return found.cond
    try:
        needed = could_gate(handle.dispatch_key, handle.dsl, op)
    except Exception:
        import logging

        logging.getLogger("python_native").exception("python_native: calibration could not gate %s %s", handle.dsl, op)
        return cond
    return Gate(op, cond, handle.dsl, getattr(handle, "explain", None), handle).cond if needed else cond


def forget_removed(handle: OverrideHandle) -> None:
    """The core's removal listener: a removed override's gate is no rival any more."""
    found = gate_of(handle.routed_cond)
    if found is not None:
        forget_gate(found.op, found.dsl)
        found.owner = None


def never_wins(op: str, dsl: str = tables.DEFAULT_DSL, dispatch_key: str = "CUDA") -> bool:
    """True when ``dsl``'s ``op`` loses to aten everywhere on every device ``dispatch_key`` serves:
    each device's sources speak for it and none has a (dtype, size, width) where it fires.
    Unknown devices (no NVML) count as every device a table is for plus any other GPU."""
    _reset_if_setting_changed()
    found = resolve.devices_at(dispatch_key)
    return bool(found) and all(r.never_wins(dsl, op) for r in found)


def has_evidence(op: str, dsl: str, dispatch_key: str = "CUDA") -> bool:
    """Whether a table or the portable policy speaks for ``dsl``'s ``op`` on every device
    ``dispatch_key`` serves (some GPU has timed it), or ``pn.benchmark`` will time it there on first
    use: what an override marked unmeasured waits for. Never raises: a failure to tell counts as no
    evidence."""
    try:
        _reset_if_setting_changed()
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
    """Forget every table, resolution, verdict learned on first use and resolved verdict; re-select
    the routers."""
    resolve.forget()
    first_use.forget()
    reread()


def regate() -> None:
    """Make the committed overrides' gating match what speaks for them now (``pn.benchmark`` was
    switched): an override nothing spoke for at its commit is gated, a gate nothing speaks for any
    more is taken off (it would cost its reads for nothing). Routers are bound to the result."""
    from python_native.core import routers

    with REGISTRY.lock:
        for o in REGISTRY.overrides():
            slot = o.slot
            if slot is None or o.unconditional or o.routed_cond is None or gate_of(o.cond) is not None:
                continue  # a gate built by hand stays as its author made it
            gate = gate_of(o.routed_cond)
            wanted = could_gate(o.dispatch_key, o.dsl, o.functional.op)
            if gate is None and wanted:
                routed = gate_override(o, o.routed_cond)
            elif gate is not None and not wanted:
                routed, gate.owner = gate.__wrapped__, None
                forget_gate(gate.op, gate.dsl)
            else:
                continue
            o.routed_cond = routed
            routers.bind(slot, o)
            REGISTRY.refresh(slot)


def reread() -> None:
    """Every gate resolves its verdicts again (``pn.benchmark`` changed); re-select the routers."""
    for gate in list(_gates):
        gate.resolved.clear()
    refresh()


def _reset_if_setting_changed() -> None:
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
