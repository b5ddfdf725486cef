"""Operators the package declares outside aten, in the ``python_native`` namespace.

Importing this package defines them (``python_native.foundations.declared``): each has a reference
implementation in plain torch that serves when no override fires, a fake kernel for
``torch.compile``/``torch.export`` and autograd. DSL backends attach overrides to them like to any
aten op (``OverrideSpec(..., lib="python_native")``).

- ``linear_cross_entropy``: ``F.cross_entropy(F.linear(input, weight, bias), target, ...)`` in
  chunks, the logits never materialised (``pn.linear_cross_entropy``).
"""

from python_native.ops.linear_cross_entropy_op import linear_cross_entropy

__all__ = ["linear_cross_entropy"]
