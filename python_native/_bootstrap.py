"""Register the built-in DSL backends and install their op libraries where they can run."""

from __future__ import annotations

import importlib
import logging

from python_native import dsl_registry, env

log = logging.getLogger("python_native")

BUILTIN_DSLS = {"triton": "dsls.triton", "cutedsl": "dsls.cutedsl"}


def load_builtin_dsls() -> None:
    """Import each built-in backend (never its runtime) and register its overrides if it can run.

    A backend that fails is logged and skipped: it must never break ``import torch``.
    """
    for name, module_name in BUILTIN_DSLS.items():
        try:
            module = importlib.import_module(module_name)
            dsl_registry.register_dsl(name, module)
        except Exception:
            log.exception("python_native: could not load the %s backend", name)
            continue
        if env.overrides_disabled():
            continue
        try:
            can_register = getattr(module, "can_register", module.runtime_available)
            if can_register():
                module.register_overrides()
        except Exception:
            log.exception("python_native: could not register the %s overrides", name)
