"""The panel: what ``torch.backends.python_native`` is made of (its module type, the DSL controllers and
scopes, the status data, the loading of the built-in backends). It stands on the features and the core."""
