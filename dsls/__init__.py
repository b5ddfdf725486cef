"""DSL backends for python-native: each subpackage wraps one kernel DSL.

Importing a backend never imports its DSL runtime; kernels are loaded on first use. The modules at
this level are shared by every backend: ``family`` (op families as declarations, and the guarded
kernel loader), ``conds`` (the conds generated from them), ``norms`` (the norm families' checks),
``reasons`` (declines in words), ``spec`` (what an op library registers), ``layout`` (tensors seen
as rows), ``scalars`` (aten's Scalar conversion, and the values the kernels leave to aten) and
``constants`` (aten's defaults, the SM count).
"""
