"""Every op verify knows how to reach: the drivers the ops' declarations carry (``Op.verify``), and
nothing else. A new op brings its cases in its declaration; this module keeps no table of its own."""

from __future__ import annotations

import dataclasses

from python_native.tools.verify.samples import Driver
from python_native_dsls.catalogue import built_ops


def _declared() -> dict[str, Driver]:
    """The drivers the declarations carry, by forward op (the first backend to declare one wins). A
    driver naming no backward ops reaches those declared as backwards under its op's public name."""
    every = built_ops()
    found: dict[str, Driver] = {}
    for built in every:
        driver, op = built.op.verify, built.op
        if driver is None or built.spec.op in found:
            continue
        if not driver.backward_ops and op.public_name is not None:
            backward = (b.spec.op for b in every if b.op.backward and (b.op.lib, b.op.public_name) == (op.lib, op.public_name))
            driver = dataclasses.replace(driver, backward_ops=tuple(dict.fromkeys(backward)))
        found[built.spec.op] = driver
    return found


DRIVERS: dict[str, Driver] = _declared()

FORWARD_OF = {b: fwd for fwd, d in DRIVERS.items() for b in d.backward_ops if b != fwd}
