"""The panel: what ``torch.backends.python_native`` is made of (its module type, the DSL controllers and
scopes, the status data, the loading of the built-in backends and the adoption of torch._native's
overrides). It stands on model patching, the features and the core."""
