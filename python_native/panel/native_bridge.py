"""One panel beside torch's in-tree registry (``torch._native``, torch 2.13 and newer).

Torch ships its own DSL overrides and installs each ``(op, key)`` behind a router of its own. Left
alone, that router would wrap ours (or ours would wrap it): two routers on one op, a trace that
misses half the calls and switches that only reach half the overrides. So while python-native is
mounted, torch's overrides are *adopted*: their routers are taken out of the dispatcher and every
``(cond, impl)`` pair of torch's registry is registered in ours under its DSL name. From then on:

- ``pn.overrides()``, the status report and ``pn.trace()`` show them (``origin_of`` tells which
  came from ``torch._native``);
- ``pn.<dsl>.disabled()``, ``operations_disabled(...)`` and every other switch apply to them;
- each op has one router, ours.

Torch's registry stays the source of truth for its own nodes: registrations made later through
``torch._native.registry.register_op_override`` are adopted at once, and its own
enable/disable/reorder calls re-sync the adopted set (nodes its filter disables are removed here).
On torch versions without ``torch._native`` nothing happens.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
import types
from collections.abc import Iterator
from typing import Any

from python_native.core.registry import REGISTRY
from python_native.foundations import dsl_registry

log = logging.getLogger("python_native")

ORIGIN = "torch._native"

_lock = threading.RLock()
# (op_symbol, dispatch_key) -> [(torch's node, our handle)] in torch's graph order.
_adopted: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
_native: types.ModuleType | None = None
_original_register_from_graph: Any = None
_original_register: Any = None


def _native_registry() -> types.ModuleType | None:
    """``torch._native.registry`` when this torch has it (importing it installs torch's routers)."""
    try:
        if importlib.util.find_spec("torch._native") is None:
            return None
    except (ImportError, ValueError):
        return None
    import torch._native.registry as registry

    return registry


def detach() -> None:
    """Take torch's routers out of the dispatcher and route its future registrations to us.

    Runs before python-native's own backends install anything, so that no router of ours ever
    captures one of torch's as its fallback.
    """
    global _native, _original_register_from_graph, _original_register
    with _lock:
        if _native is not None:
            return
        registry = _native_registry()
        if registry is None or not hasattr(registry, "_register_overrides_from_graph"):
            return
        _native = registry
        _original_register_from_graph = registry._register_overrides_from_graph
        registry._register_overrides_from_graph = _sync_graph
        _original_register = registry.register_op_override
        _route_through_panel(registry)
        for op_symbol, dispatch_key in list(registry._aten_override_libs):
            registry._destroy_aten_override(op_symbol, dispatch_key)


def _register_op_override(*args: Any, **kwargs: Any) -> Any:
    result = _original_register(*args, **kwargs)
    _sync_all()  # torch defers installation; the panel adopts new nodes at once
    return result


def _route_through_panel(registry: types.ModuleType) -> None:
    registry._register_overrides_from_graph = _sync_graph
    _register_op_override.__doc__ = _original_register.__doc__
    registry.register_op_override = _register_op_override


@contextlib.contextmanager
def standalone() -> Iterator[None]:
    """Inside the block, torch's registry installs its own routers, as it would without us.

    For side-by-side comparisons (``benchmarks/router_overhead.py``) and debugging. On exit,
    routers torch installed meanwhile are taken out again and their overrides adopted.
    """
    if _native is None:
        yield
        return
    with _lock:
        _native._register_overrides_from_graph = _original_register_from_graph
        _native.register_op_override = _original_register
    try:
        yield
    finally:
        with _lock:
            _route_through_panel(_native)
            for op_symbol, dispatch_key in list(_native._aten_override_libs):
                _native._destroy_aten_override(op_symbol, dispatch_key)
            _sync_all()


def adopt_all() -> None:
    """Register every node of torch's registry in ours (after python-native's own backends)."""
    if _native is not None:
        _sync_all()


def _sync_all() -> None:
    for (op_symbol, dispatch_key), graph in list(_native._graphs.items()):
        _sync_graph(op_symbol, dispatch_key, graph, filter_state=_native._filter_state)


def _sync_graph(op_symbol: str, dispatch_key: str, graph: list, *, filter_state: Any = None) -> None:
    """Make our adopted handles for ``(op_symbol, dispatch_key)`` match torch's enabled nodes.

    Stands in for torch's ``_register_overrides_from_graph``: same arguments, but instead of
    installing a second router it adds and removes overrides in python-native's registry.
    """
    with _lock:
        wanted = [n for n in graph if filter_state is None or filter_state.check_enabled(n)]
        current = _adopted.get((op_symbol, dispatch_key), [])
        kept = []
        for node, handle in current:
            if any(node is n for n in wanted):
                kept.append((node, handle))
            else:
                handle.remove()
        for node in graph:
            node.active = any(node is n for n in wanted)
        have = {id(node) for node, _ in kept}
        for node in wanted:
            if id(node) in have:
                continue
            handle = _adopt(node)
            if handle is not None:
                kept.append((node, handle))
        order = {id(n): i for i, n in enumerate(graph)}
        kept.sort(key=lambda pair: order[id(pair[0])])
        if kept:
            _adopted[(op_symbol, dispatch_key)] = kept
        else:
            _adopted.pop((op_symbol, dispatch_key), None)


def _adopt(node: Any) -> Any:
    """Register one of torch's nodes with us; on refusal, torch routes that op itself again."""
    _ensure_dsl(node.dsl_name)
    try:
        return REGISTRY.register(
            node.dsl_name, "aten", node.op_symbol, node.dispatch_key,
            None if node.unconditional_override else node.cond_fn, node.impl_fn,
            unconditional_override=node.unconditional_override,
        )
    except Exception as e:
        log.warning(
            "python_native: could not adopt torch._native's %s override of %s at %s (%s); "
            "torch's own router serves it, outside this panel",
            node.dsl_name, node.op_symbol, node.dispatch_key, e,
        )
        _original_register_from_graph(node.op_symbol, node.dispatch_key, [node])
        return None


def _ensure_dsl(name: str) -> None:
    """Make torch's DSL name known to ours (its module from torch's DSL registry when it has one)."""
    if dsl_registry.is_registered(name):
        return
    module = None
    try:
        from torch._native.dsl_registry import dsl_registry as native_dsls

        module = native_dsls.get_dsl_module(name)
    except Exception:
        pass
    if module is None:
        module = types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: None)
    dsl_registry.register_dsl(name, module)


def origin_of(handle: Any) -> str | None:
    """``"torch._native"`` for an override adopted from torch's registry, else None."""
    with _lock:
        for pairs in _adopted.values():
            if any(h is handle for _, h in pairs):
                return ORIGIN
    return None


def adopted() -> list[Any]:
    """Our handles of every adopted override, slot by slot in torch's order."""
    with _lock:
        return [h for pairs in _adopted.values() for _, h in pairs]
