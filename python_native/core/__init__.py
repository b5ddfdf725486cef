"""The dispatch core: slots in the dispatcher, override handles, ordering and the router life cycle.

It knows nothing of the features built on it. They plug in through ``extensions``: cond and impl
wrappers applied when an override is committed (baked into the generated router, never looked
up per call) and listeners told when the set of overrides changes. Import the rooms directly:
``python_native.core.registry`` (the ``REGISTRY`` of the process), ``core.handles``,
``core.extensions``, ``core.slots``, ``core.routers`` (each slot's generated routers, one per set of
active overrides), ``core.reclaim`` (what removals take out of service, freed once no call can be
inside it), ``core.ordering``, ``core.index``, ``core.arguments`` (a registration's checks),
``core.variants`` (an override's alternative impls), ``core.explainers`` (why a traced call fell back),
``core.nested_aten`` (no override inside a switched-off op's aten kernel) and ``core.errors``
(``OverrideUnavailable``).
"""
