"""Triton kernels and their host-side launchers; every module here imports triton.

The op modules in ``python_native_dsls.triton.ops`` import these lazily, from inside their impls, so that
registering the library never pays for importing triton.
"""
