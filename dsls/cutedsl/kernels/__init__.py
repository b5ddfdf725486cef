"""CuTe DSL row kernels and the machinery that compiles, caches and loads them.

Every module here imports cutlass at its top and is only imported by an impl's first call or by
``python -m python_native precompile``; ``compiler`` is the one entry point the ops use.
"""
