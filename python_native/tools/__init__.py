"""Tools: the commands of ``python -m python_native`` and what they are built from (benchmarks,
verification, the kernel report, the status report's layout, the demo). Nothing below imports them."""
