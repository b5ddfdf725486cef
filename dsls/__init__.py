"""DSL backends for python-native: each subpackage wraps one kernel DSL.

Importing a backend never imports its DSL runtime; kernels are loaded on first use.
"""
