"""Operators the package declares outside aten, in the ``python_native`` namespace.

Importing this package defines them (``python_native.foundations.custom_ops``): each has a reference
implementation in plain torch that serves when no override fires, a fake kernel for
``torch.compile``/``torch.export`` and autograd. DSL backends attach overrides to them like to any
aten op (``OverrideSpec(..., lib="python_native")``).

- ``linear_cross_entropy``: ``F.cross_entropy(F.linear(input, weight, bias), target, ...)`` in
  chunks, the logits never materialised (``pn.linear_cross_entropy``).
- ``rms_norm`` (and ``rms_norm_backward``): RMSNorm as transformers' modules write it by hand.
- ``swiglu``, ``geglu`` (and their backwards): the gated activation of an MLP, ``act(gate) * up``.
- ``rotary`` (and ``rotary_backward``): ``apply_rotary_pos_emb`` of q and k in one call.
- ``gelu_tanh``, ``quick_gelu`` (and their backwards): activations models write by hand.
- ``moe_route`` and ``moe_experts`` (and their backwards): a mixture-of-experts layer's router and
  its experts (stacked expert weights, tokens grouped by expert).

Each backward is declared under its forward's public name, so ``pn.operations_disabled("swiglu")``
switches both. ``python_native.patching`` routes a model's modules to these ops.
"""

from python_native.ops.activation_op import gelu_tanh, quick_gelu
from python_native.ops.gated_op import geglu, swiglu
from python_native.ops.linear_cross_entropy_op import linear_cross_entropy
from python_native.ops.moe_experts_op import moe_experts
from python_native.ops.moe_route_op import moe_route
from python_native.ops.rms_norm_op import rms_norm
from python_native.ops.rotary_op import rotary

__all__ = ["gelu_tanh", "geglu", "linear_cross_entropy", "moe_experts", "moe_route", "quick_gelu", "rms_norm", "rotary", "swiglu"]
