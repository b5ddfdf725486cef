"""DSL backends for python-native: each subpackage wraps one kernel DSL.

Importing a backend never imports its DSL runtime; kernels are loaded on first use. The modules at
this level are shared by every backend: ``spec`` (what an op library declares) and ``layout``
(tensors seen as rows).
"""
