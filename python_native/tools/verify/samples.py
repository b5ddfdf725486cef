"""Samples: one call of the public torch function that reaches an op, on given inputs.

``samples_for`` interleaves an op's own catalogue of awkward inputs (its ``Driver.cases``) with
torch's OpInfo samples. ``torch.testing._internal.common_methods_invocations`` is slow to import,
so it is imported only when OpInfo samples are first asked for. ``Sample`` and ``Driver`` are declared with the ops
(``python_native_dsls.proving``: an op's ``Op.verify``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from python_native_dsls.proving import Driver, Sample

__all__ = ["Driver", "Sample", "opinfo_problem", "samples_for"]


def opinfo_problem() -> str | None:
    """Why torch's OpInfo tables cannot be used here (they need ``expecttest``), or None."""
    try:
        import torch.testing._internal.common_methods_invocations  # noqa: F401
    except Exception as e:  # a torch install without its test tables or their dependencies
        return f"{type(e).__name__}: {e}"
    return None


def _opinfo_samples(names: Sequence[str], dtype: torch.dtype, device: str) -> Iterator[Sample]:
    """OpInfo samples of ``names``; none where torch's test tables are not importable."""
    if opinfo_problem() is not None:
        return
    from torch.testing._internal.common_methods_invocations import op_db
    for info in op_db:
        label = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if label not in names or dtype not in info.supported_dtypes(device):
            continue
        try:
            samples = list(info.sample_inputs(device, dtype, requires_grad=False))
        except Exception:
            continue
        for s in samples:
            if not isinstance(s.input, torch.Tensor):
                continue
            args = list(s.args)
            slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            named = [k for k, v in s.kwargs.items() if isinstance(v, torch.Tensor)]  # weight=, bias=, ...
            tensors = [s.input, *[args[i] for i in slots], *[s.kwargs[k] for k in named]]

            def fn(*ts, _op=info.op, _args=args, _slots=slots, _named=named, _kw=s.kwargs):
                call, kw = list(_args), dict(_kw)
                for i, t in zip(_slots, ts[1:], strict=False):
                    call[i] = t
                kw.update(zip(_named, ts[1 + len(_slots):], strict=True))
                return _op(ts[0], *call, **kw)

            yield Sample(f"OpInfo {label}", fn, tensors, dict(s.kwargs))


def samples_for(driver: Driver, dtype: torch.dtype, device: str, limit: int | None) -> list[Sample]:
    """At most ``limit`` samples, the catalogue's cases and OpInfo's taken in turn."""
    own = driver.cases(dtype, device)
    theirs = _opinfo_samples(driver.opinfos, dtype, device)
    merged = (s for pair in itertools.zip_longest(own, theirs) for s in pair if s is not None)
    return list(itertools.islice(merged, limit))
