"""A calibration table as data: its format, its validation, and its per-bucket verdicts.

A table is JSON: ``format``, ``device`` (``"<torch.cuda.get_device_name>/sm<major><minor>"``, or
``"cpu"`` for Triton's interpreter), the versions it was measured with (``torch``, ``triton``,
``dsls``), ``date``, ``threshold``, optionally ``device_properties`` (SMs, memory bandwidth: what
the portable policy scales by) and ``rows`` (``dsl``, ``op``, ``dtype``, ``bucket``, ``shape``,
``last_dim``, ``override_ms``, ``aten_ms``, ``speedup``, ``wins``).

Size bucket: ``numel.bit_length()`` of the op's first tensor argument (0 for empty tensors): a
numel() call and an int bit_length per call, and norms, softmaxes and activations are bandwidth
bound, so their cost follows the element count. Width class: narrow or wide rows (that argument's
last dim below or at least ``WIDE_ROW``): row kernels can lose on narrow rows and win on wide ones
of the same size, so each (bucket, class) has its own verdict. ``cell_of`` is that rule for a
call (a gate's per-call path writes it out with these constants, a test holds the two equal), and
a compiled front is made with ``WIDE_ROW`` (``extensions.CallGates``).

Two optional fields say what a verdict is worth now: the header's ``kernels`` (per DSL, per op,
the version of the sources that were timed: ``versions``; a row's own ``kernel`` says it for that
row; rows of another version count as unmeasured) and a row's ``first_use`` (measured by
``pn.benchmark`` on a call's own arguments: it speaks for its own (bucket, width class) only,
never for its neighbours).

Everything read from a file is checked here before it is used: a table that is not an object,
holds unhashable or mistyped fields, nests too deeply or says ``"wins": "false"`` raises
``ValueError`` naming the file, the place and what is allowed, and is then skipped whole.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from typing import Any

FORMAT = 1
MAX_BUCKET = 64
DEFAULT_DSL = "triton"  # the DSL of rows that name none
# Rows at least this long (the last dim of the op's first tensor argument) are "wide".
WIDE_ROW = 4096
MAX_FILE_BYTES = 64 << 20  # larger than any table: not one of ours

# Per (bucket, width class) at index ``2 * bucket + wide``: False (loses to aten) or the DSLs
# calibrated faster, fastest first (an empty tuple: this DSL serves).
Verdicts = tuple
VerdictMap = dict[tuple[str, str], dict[str, Verdicts]]  # (op, dtype) -> dsl -> verdicts


def size_bucket(numel: int) -> int:
    """The size bucket of a problem of ``numel`` elements: ``floor(log2(numel)) + 1``, capped."""
    return min(int(numel).bit_length(), MAX_BUCKET)


def width_class(last_dim: int | None) -> int:
    """0 for narrow rows, 1 for wide ones (``last_dim >= WIDE_ROW``)."""
    return 1 if last_dim is not None and last_dim >= WIDE_ROW else 0


def cell_of(t: Any) -> int:
    """Where a call with first tensor argument ``t`` reads its verdict: ``2 * bucket + width class``."""
    return 2 * min(t.numel().bit_length(), MAX_BUCKET) + (1 if t.ndim and t.shape[-1] >= WIDE_ROW else 0)


def device_slug(device_key: str) -> str:
    """``NVIDIA H100 80GB HBM3/sm90`` -> ``nvidia_h100_80gb_hbm3_sm90``."""
    slug = "".join(c if c.isalnum() else "_" for c in device_key.lower())
    return "_".join(part for part in slug.split("_") if part)


def table_filename(device_key: str) -> str:
    """A file name for a device key: ``NVIDIA H100 80GB HBM3/sm90`` -> ``nvidia_h100_80gb_hbm3_sm90.json``."""
    return device_slug(device_key) + ".json"


def _show(value: Any) -> str:
    """A short, safe rendering of any JSON value for an error message, as JSON writes it (never recurses)."""
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    if value is None:
        return "null"
    try:
        text = json.dumps(value)
    except ValueError:  # nan, inf
        text = repr(value)
    kind = {str: "a string", bool: "a boolean"}.get(type(value), "a number")
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({kind})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


_ROW_FIELDS = {  # optional row fields: how each must look
    "dsl": (_name, "a non-empty string"),
    "last_dim": (lambda v: v is None or (_is_int(v) and v >= 0), "a non-negative integer or null"),
    "shape": (lambda v: isinstance(v, list) and all(_is_int(d) and d >= 0 for d in v), "an array of non-negative integers"),
    "override_ms": (lambda v: v is None or _is_number(v), "a number or null"),
    "aten_ms": (lambda v: v is None or _is_number(v), "a number or null"),
    "speedup": (lambda v: v is None or _is_number(v), "a number or null"),
    "first_use": (lambda v: isinstance(v, bool), "true or false"),
    "kernel": (_name, "a kernel version string"),
}
_HEADER_FIELDS = {
    "torch": (lambda v: v is None or isinstance(v, str), "a version string"),
    "triton": (lambda v: v is None or isinstance(v, str), "a version string"),
    "date": (lambda v: v is None or isinstance(v, str), "a string"),
    "threshold": (lambda v: v is None or _is_number(v), "a number"),
    "dsls": (lambda v: isinstance(v, dict) and all(_name(k) and isinstance(x, str) for k, x in v.items()),
             "an object of DSL name -> version string"),
    "device_properties": (
        lambda v: isinstance(v, dict) and all(_name(k) and _is_number(x) and x > 0 for k, x in v.items()),
        "an object of positive numbers (sm_count, memory_bandwidth_gbps)",
    ),
    "kernels": (
        lambda v: isinstance(v, dict) and all(_name(d) and isinstance(ops, dict) and all(
            _name(op) and _name(x) for op, x in ops.items()) for d, ops in v.items()),
        "an object of DSL name -> {op: kernel version string}",
    ),
}


def validate(table: Any, source: str = "table") -> None:
    """Raise ``ValueError`` naming what is wrong with a table read from ``source``; any JSON value is safe."""
    if not isinstance(table, dict):
        raise ValueError(f"{source}: not a calibration table: a JSON object is needed, got {_show(table)}")
    if not _is_int(table.get("format")) or table["format"] != FORMAT:
        raise ValueError(f"{source}: not a calibration table of format {FORMAT} (got format {_show(table.get('format'))})")
    if not _name(table.get("device")):
        raise ValueError(f"{source}: 'device' must be a non-empty string, got {_show(table.get('device'))}")
    for field, (ok, allowed) in _HEADER_FIELDS.items():
        if field in table and not ok(table[field]):
            raise ValueError(f"{source}: {field!r} must be {allowed}, got {_show(table[field])}")
    rows = table.get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"{source}: 'rows' must be an array, got {_show(rows)}")
    i = _plain_until(rows, 0)
    while i < len(rows):  # a row that is not plain is checked field by field: it raises where it is bad
        _validate_row(rows[i], f"{source}: row {i}")
        i = _plain_until(rows, i + 1)


_REQUIRED = frozenset({"op", "dtype", "bucket", "wins"})


def _plain_until(rows: list[Any], start: int) -> int:
    """The index of the first row from ``start`` that is not plain (``len(rows)`` where none is).

    Plain, the common case, checked fast: the required fields well typed and the optional ones of
    the usual types. One loop over the rows, a constant few operations a row (a name is stripped
    the first time it is seen only; rows of the required fields alone skip the optional ones), so
    a table validates in time linear in its rows. A row that is not plain may still be valid:
    ``_validate_row`` checks it field by field.
    """
    names: set[str] = set()  # strings found non-blank already
    for i in range(start, len(rows)):
        row = rows[i]
        if type(row) is not dict:
            return i
        op, dtype, bucket = row.get("op"), row.get("dtype"), row.get("bucket")
        if type(op) is not str or type(dtype) is not str or type(bucket) is not int or not 0 <= bucket <= MAX_BUCKET:
            return i  # also a required field missing
        if type(row.get("wins")) is not bool:
            return i
        if (op not in names and not _named(names, op)) or (dtype not in names and not _named(names, dtype)):
            return i
        if len(row) > len(_REQUIRED) and not _optional_plain(row, names):
            return i
    return len(rows)


def _named(names: set[str], text: str) -> bool:
    """Whether the string ``text`` is not blank (remembered in ``names``)."""
    if text in names:
        return True
    if not text.strip():
        return False
    names.add(text)
    return True


def _optional_plain(row: dict[str, Any], names: set[str]) -> bool:
    """The optional fields of a row, where present, of the usual types (``_plain_until``)."""
    last = row.get("last_dim")
    if last is not None and (type(last) is not int or last < 0):
        return False
    shape = row.get("shape")
    if shape is not None:
        if type(shape) is not list:
            return False
        for d in shape:
            if type(d) is not int or d < 0:
                return False
    for key in ("override_ms", "aten_ms", "speedup"):
        value = row.get(key)
        if value is not None and (type(value) not in (float, int) or not -_BIG < value < _BIG):
            return False  # also nan and inf
    first_use, kernel, dsl = row.get("first_use", False), row.get("kernel", "-"), row.get("dsl", "triton")
    return (type(first_use) is bool and type(kernel) is str and (kernel in names or _named(names, kernel))
            and type(dsl) is str and (dsl in names or _named(names, dsl)))


_BIG = float("inf")


def _validate_row(row: Any, where: str) -> None:
    """Check a row that is not plain field by field: ``ValueError`` naming the first field that is bad."""
    if not isinstance(row, dict):
        raise ValueError(f"{where} must be an object, got {_show(row)}")
    missing = sorted(_REQUIRED - set(row))
    if missing:
        raise ValueError(f"{where} lacks {missing}")
    for field in ("op", "dtype"):
        if not _name(row[field]):
            raise ValueError(f"{where}: {field!r} must be a non-empty string, got {_show(row[field])}")
    if not _is_int(row["bucket"]) or not 0 <= row["bucket"] <= MAX_BUCKET:
        raise ValueError(f"{where}: bucket {_show(row['bucket'])} is not an integer in 0..{MAX_BUCKET}")
    if not isinstance(row["wins"], bool):
        raise ValueError(f"{where}: 'wins' must be true or false (a JSON boolean), got {_show(row['wins'])}")
    for field, (ok, allowed) in _ROW_FIELDS.items():
        if field in row and not ok(row[field]):
            raise ValueError(f"{where}: {field!r} must be {allowed}, got {_show(row[field])}")


def parse(text: str | bytes, source: str = "table") -> dict[str, Any]:
    """A validated table from a file's content; ``ValueError`` names what is wrong."""
    try:
        table = json.loads(text)
    except RecursionError:
        raise ValueError(f"{source}: not a calibration table: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{source}: not valid JSON ({e})") from None
    validate(table, source)
    return table


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate one table file (``OSError`` where it cannot be read, ``ValueError`` where it is bad)."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: over {MAX_FILE_BYTES >> 20} MiB: not a calibration table")
    return parse(data, str(path))


def row_classes(row: dict[str, Any]) -> tuple[int, ...]:
    """The width classes a table row speaks for: from its ``last_dim`` (the op's first tensor
    argument's last dim), else its ``shape``; both classes for rows that have neither."""
    last = row.get("last_dim")
    if type(last) is int:  # the common case, first
        return (1,) if last >= WIDE_ROW else (0,)
    if last is None and isinstance(row.get("shape"), list) and row["shape"]:
        last = row["shape"][-1]
    return (0, 1) if not _is_int(last) else (width_class(last),)


def _speedup(row: dict[str, Any]) -> float:
    """aten time over override time for a row (rows without timings rank by their verdict alone)."""
    if _is_number(row.get("speedup")):
        return float(row["speedup"])
    ours, base = row.get("override_ms"), row.get("aten_ms")
    if _is_number(ours) and _is_number(base) and ours > 0:
        return base / ours
    return 1.0


def _filled(measured: dict[int, Any]) -> list[Any]:
    """``measured``'s value at the nearest calibrated bucket (ties go low), for every bucket 0..MAX_BUCKET."""
    order = sorted(measured)
    out = []
    for bucket in range(MAX_BUCKET + 1):
        i = bisect.bisect_left(order, bucket)
        if i == len(order) or (i > 0 and bucket - order[i - 1] <= order[i] - bucket):
            i -= 1
        out.append(measured[order[i]])
    return out


Cells = tuple[dict[int, list], dict[int, list]]  # per width class: bucket -> [won, speedups]


def _measured_cells(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Cells]]:
    """Per (op, dtype), per DSL, per width class and bucket: whether every row there won, and the
    rows' speedups in their order. Linear in the rows: a row adds to its cells in place (a cell's
    list is never copied), through the common cases written out (a call costs a row more here)."""
    by_cell: dict[tuple[str, str, str], Cells] = {}  # (op, dtype, dsl) -> cells
    big, wide_row, both = _BIG, WIDE_ROW, (0, 1)
    for row in rows:
        key = (row["op"], row["dtype"], row.get("dsl", DEFAULT_DSL))
        classes = by_cell.get(key)
        if classes is None:
            classes = by_cell[key] = ({}, {})
        speedup, last, bucket, lost = row.get("speedup"), row.get("last_dim"), row["bucket"], row["wins"] is not True
        if type(speedup) is not float or not -big < speedup < big:
            speedup = 1.0 if speedup is None and row.get("override_ms") is None else _speedup(row)
        if type(last) is int:
            wides = (1,) if last >= wide_row else (0,)
        else:
            wides = both if last is None and row.get("shape") is None else row_classes(row)
        for wide in wides:
            # Several shapes in one (bucket, class): the override wins there only if it won for all.
            cell = classes[wide].get(bucket)
            if cell is None:
                cell = classes[wide][bucket] = [True, []]
            if lost:
                cell[0] = False
            cell[1].append(speedup)
    by_key: dict[tuple[str, str], dict[str, Cells]] = {}
    for (op, dtype, dsl), classes in by_cell.items():
        by_key.setdefault((op, dtype), {})[dsl] = classes
    return by_key


def verdicts(rows: list[dict[str, Any]]) -> VerdictMap:
    """Per (op, dtype), per DSL, one verdict per (bucket 0..MAX_BUCKET, width class), each filled
    from the nearest calibrated bucket of its class (of the other class where its own has no rows).

    A DSL's verdict is False where it loses to aten, else the tuple of the other DSLs that also beat
    aten there and were measured faster (fastest first): its gate declines while one of those can serve.
    Rows without a ``dsl`` (tables written before several DSLs were calibrated) are Triton's.
    """
    by_key = _measured_cells(rows)
    out: VerdictMap = {}
    for key, per_dsl in by_key.items():
        filled = {}
        for dsl, classes in per_dsl.items():  # each cell's mean once, before it fills its neighbours
            means = [{bucket: (won, sum(s) / len(s)) for bucket, (won, s) in cells.items()} for cells in classes]
            narrow, wide = (_filled(means[c] or means[1 - c]) for c in (0, 1))
            filled[dsl] = [cell for pair in zip(narrow, wide, strict=True) for cell in pair]
        out[key] = {}
        for dsl, buckets in filled.items():
            found = []
            for i, (won, speed) in enumerate(buckets):
                if not won:
                    found.append(False)
                    continue
                rivals = [(other[i][1], name) for name, other in filled.items()
                          if name != dsl and other[i][0] and (other[i][1], name) > (speed, dsl)]
                found.append(tuple(name for _, name in sorted(rivals, reverse=True)))
            out[key][dsl] = tuple(found)
    return out


def confirm_wins(rows: list[dict[str, Any]], threshold: float) -> None:
    """Set each measured row's ``wins``: its cell (DSL, op, dtype, width class, bucket; every shape
    of the bucket) beat aten by ``threshold``, and so did each larger calibrated bucket of that
    cell's class. An override's edge grows with size as its host cost is amortized, so a lone
    "win" below a loss is the timer's noise. The largest bucket has no larger one to confirm it:
    there the win must clear twice the margin, or the next smaller bucket must win too.
    """
    cells: dict[tuple, dict[int, float]] = {}
    for row in rows:
        if not _is_number(row.get("speedup")):
            continue
        for wide in row_classes(row):
            cell = cells.setdefault((row.get("dsl", DEFAULT_DSL), row["op"], row["dtype"], wide), {})
            cell[row["bucket"]] = min(cell.get(row["bucket"], float("inf")), float(row["speedup"]))
    confirmed: dict[tuple, bool] = {}
    for key, speedups in cells.items():
        larger_won = True
        order = sorted(speedups, reverse=True)
        for i, bucket in enumerate(order):
            won = speedups[bucket] >= threshold and larger_won
            if i == 0 and len(order) > 1:
                won = won and (speedups[bucket] >= 2 * threshold - 1 or speedups[order[1]] >= threshold)
            confirmed[(*key, bucket)] = larger_won = won
    for row in rows:
        if _is_number(row.get("speedup")):
            key = (row.get("dsl", DEFAULT_DSL), row["op"], row["dtype"])
            row["wins"] = all(confirmed[(*key, wide, row["bucket"])] for wide in row_classes(row))


def winning_from(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], int | None]:
    """Per (dsl, op, dtype, width class) with rows of that class: the smallest calibrated bucket
    from which every larger calibrated bucket won (all its shapes), or None where the largest lost.
    First-use rows are no calibration run: they are left out."""
    cells: dict[tuple[str, str, str, int], dict[int, bool]] = {}
    for row in rows:
        if row.get("first_use"):
            continue
        for wide in row_classes(row):
            cell = cells.setdefault((row.get("dsl", DEFAULT_DSL), row["op"], row["dtype"], wide), {})
            cell[row["bucket"]] = cell.get(row["bucket"], True) and row["wins"] is True
    out: dict[tuple[str, str, str, int], int | None] = {}
    for key, won in cells.items():
        first = None
        for bucket in sorted(won, reverse=True):
            if not won[bucket]:
                break
            first = bucket
        out[key] = first
    return out
