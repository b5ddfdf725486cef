"""Why a traced call fell back: each override's decline explained, each switched-off override named.

Only traced routers use this module (see ``codegen.router_source``): an untraced call never asks
for an explanation. An explanation is for people reading a trace, so nothing here may break the
call: an explainer that raises becomes a reason saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from python_native.foundations import dsl_registry, env

if TYPE_CHECKING:
    from python_native.core.handles import OverrideHandle
    from python_native.core.slots import Slot

Explain = Callable[..., "str | None"]
DECLINED = "cond declined"


def check_explain(explain: Any, cond: Any) -> Explain | None:
    """The explainer of an override: ``explain`` as given, else the cond's own ``explain``
    attribute (a cond object, or a function with one set), else None."""
    if explain is None:
        found = getattr(cond, "explain", None)
        return found if callable(found) else None
    if not callable(explain):
        raise TypeError(
            f"explain must be a callable taking the op's arguments and returning a str (or None), "
            f"got {type(explain).__name__}: {explain!r}"
        )
    return explain


def explainer(handle: OverrideHandle) -> Callable[..., str]:
    """``(*args, **kwargs) -> "dsl: why"`` for a call ``handle``'s routed cond declined.

    A feature that wraps the cond (the calibration gate) gives its wrapper an ``explain`` that
    covers its own declines and defers to the override's for the rest; where the routed cond is
    the registered one, the override's explainer answers.
    """
    routed = handle.routed_cond
    explain = getattr(routed, "explain", None) if routed is not handle.cond else None
    if not callable(explain):
        explain = handle.explain
    dsl = handle.dsl

    def explain_decline(*args: Any, **kwargs: Any) -> str:
        if explain is None:
            return f"{dsl}: {DECLINED}"
        try:
            text = explain(*args, **kwargs)
        except Exception as e:  # an explanation never breaks the call it explains
            return f"{dsl}: {DECLINED} (its explanation raised {type(e).__name__}: {e})"
        return f"{dsl}: {text}" if text else f"{dsl}: {DECLINED}"

    return explain_decline


def unavailable(dsl: str, error: BaseException) -> str:
    """The reason of an impl that raised ``OverrideUnavailable``."""
    text = str(error)
    return text if text.startswith(f"{dsl}:") else f"{dsl}: unavailable ({text or type(error).__name__})"


def _switch_text(switch: Any, kind: str, name: str) -> str:
    held_only = name in switch.holds and name not in switch.explicit
    return f"{kind} {name} disabled{' by a scope' if held_only else ''}"


def why_off(o: OverrideHandle) -> str:
    """Which switch keeps ``o`` out of routing (the registry's activity rule, spelled out)."""
    registry = o._registry
    s = registry.switches
    if registry.killed:
        return f"every override disabled ({'/'.join(env.DISABLE_ALL)})"
    if s.all.off:
        scoped = s.all.holds and not s.all.explicit
        return "every override disabled (pn.enabled is False" + (", by a scope)" if scoped else ")")
    if o.dsl in registry.unroutable_dsls:
        return f"DSL {o.dsl} unavailable: {dsl_registry.runtime_failure(o.dsl) or 'its runtime cannot run here'}"
    if o.dsl in s.dsl.off:
        return _switch_text(s.dsl, "DSL", o.dsl)
    if o.dispatch_key in s.key.off:
        return _switch_text(s.key, "dispatch key", o.dispatch_key)
    for name in o.op_names:
        if name in s.op.off:
            return _switch_text(s.op, "op", name)
    return "inactive"


def fallback_reason(slot: Slot, declines: Sequence[str]) -> str | None:
    """Why ``slot``'s call runs the original kernel: the declines the router collected, then every
    override of the slot it did not route to, with the switch that keeps it out."""
    parts = list(declines)
    active = slot.active
    for o in slot.overrides:
        if o not in active:
            parts.append(f"{o.dsl}: {why_off(o)}")
    return "; ".join(parts) or None
