"""What each Triton kernel costs on a GPU, read on any machine: ``python -m python_native inspect``."""
