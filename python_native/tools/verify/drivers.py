"""Every op verify knows how to reach, by family: each family module lists its own drivers."""

from __future__ import annotations

from python_native.tools.verify import group_norm_dropout, indexing, linear_cross_entropy, model_ops, reductions, rows
from python_native.tools.verify.samples import Driver

DRIVERS: dict[str, Driver] = {**rows.DRIVERS, **group_norm_dropout.DRIVERS, **reductions.DRIVERS, **indexing.DRIVERS,
                              **linear_cross_entropy.DRIVERS, **model_ops.DRIVERS}

FORWARD_OF = {b: fwd for fwd, d in DRIVERS.items() for b in d.backward_ops if b != fwd}
