"""Check every installed override against aten on this machine, forward and backward.

Each override's op is driven through the public torch call that reaches it (``torch.softmax``
reaches ``aten::_softmax`` and, in backward, ``aten::_softmax_backward_data``) on OpInfo samples
where torch ships them plus a small catalogue of awkward inputs. Every sample runs three times: with
the overrides, with the override's DSL disabled (aten), and in float64 with it disabled (the
truth). The override passes when it is as close to aten as the dtype's default tolerance, or no
further from the truth than aten is (see ``mismatch``). An override that raises on an input its
cond accepted is a failure too: conds must decline what impls cannot do.

Rooms: ``samples`` (catalogue cases, OpInfo samples), ``drivers`` (the drivers the ops'
declarations carry, ``Op.verify``: verify keeps no table of its own), ``compare`` (the pass rule),
``run`` (running and the report).
"""

from python_native.tools.verify.compare import TOLERANCES, max_error, mismatch
from python_native.tools.verify.drivers import DRIVERS, FORWARD_OF
from python_native.tools.verify.run import DTYPES, Row, render, to_json, verify
from python_native.tools.verify.samples import Driver, Sample, opinfo_problem, samples_for

__all__ = ["DRIVERS", "DTYPES", "FORWARD_OF", "TOLERANCES", "Driver", "Row", "Sample", "max_error", "mismatch",
           "opinfo_problem", "render", "samples_for", "to_json", "verify"]
