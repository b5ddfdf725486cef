"""How measured rows are shown: the table's header and lines, the geometric mean, the plot, the JSON document."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from python_native.tools.bench.rows import Row

MISSING = "–"


def _cell(value: float | None, fmt: str = "10.4f") -> str:
    return f"{value:{fmt}}" if value is not None else f"{MISSING:>{fmt.split('.')[0]}}"


HEADER = (f"{'case':<34} {'dtype':<9} {'fired':<6} {'pn ms':>10} {'aten ms':>10} {'speedup':>8} "
          f"{'inductor':>10} {'liger':>10} {'quack':>10} {'%bw':>5}")


def format_row(row: Row) -> str:
    label = f"{row.op} {row.mode} {'x'.join(map(str, row.shape))}"
    bw = f"{100 * row.bandwidth_fraction:5.0f}" if row.bandwidth_fraction is not None else f"{MISSING:>5}"
    line = (f"{label:<34} {row.dtype:<9} {'yes' if row.fired else 'no':<6} {row.override_ms:10.4f} "
            f"{row.aten_ms:10.4f} {row.speedup:7.2f}x {_cell(row.inductor_ms)} {_cell(row.liger_ms)} "
            f"{_cell(row.quack_ms)} {bw}")
    line += "".join(f" {name} {ms:.4f}" for name, ms in row.variants_ms.items())  # --variants: one cell each
    return line + ("  # " + "; ".join(row.notes) if row.notes else "")


def geometric_mean_line(rows: Sequence[Row]) -> str:
    fired = [r.speedup for r in rows if r.fired and r.speedup > 0]
    if not fired:
        return "no override fired"
    geo = math.exp(sum(math.log(r) for r in fired) / len(fired))
    return (f"geometric-mean speedup where an override fired: {geo:.2f}x over {len(fired)} rows; "
            f"slowest {min(fired):.2f}x")


def json_document(env: dict[str, Any], rows: Sequence[Row]) -> str:
    """The environment and the rows measured so far, as ``--json`` prints and ``--save-json`` writes them."""
    return json.dumps({"environment": env, "rows": [dataclasses.asdict(r) for r in rows]}, indent=1)


def plot(rows: Sequence[Row], path: str) -> int:
    """One subplot per op: speedup over aten against element count (log scale), one line per (mode, dtype).

    Rows where no override fired measured aten against itself: their points are drawn hollow and
    grey, labelled "no override fired", never as speedups. Returns how many such rows there were.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from e
    ops = sorted({r.op for r in rows})
    fig, axes = plt.subplots(len(ops), 1, figsize=(9, 3.2 * len(ops)), squeeze=False)
    unfired = 0
    for ax, op in zip(axes[:, 0], ops, strict=True):
        series: dict[str, list[Row]] = {}
        for r in rows:
            if r.op == op:
                series.setdefault(f"{r.mode} {r.dtype}", []).append(r)
        ticks: dict[int, str] = {}
        for name, points in sorted(series.items()):
            points.sort(key=lambda r: math.prod(r.shape))
            fired = [r for r in points if r.fired]
            if fired:
                ax.plot([math.prod(r.shape) for r in fired], [r.speedup for r in fired], marker="o", label=name)
            idle = [r for r in points if not r.fired]
            if idle:
                unfired += len(idle)
                ax.scatter([math.prod(r.shape) for r in idle], [r.speedup for r in idle], marker="o",
                           facecolors="none", edgecolors="grey", label=f"{name}: no override fired (aten ran)")
            for r in points:
                ticks.setdefault(math.prod(r.shape), "x".join(map(str, r.shape)))
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ticks), list(ticks.values()), fontsize=7, rotation=20)
        ax.minorticks_off()
        ax.set_xlabel("shape (log scale of elements)")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(op)
        ax.set_ylabel("speedup vs aten")
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return unfired


def _save(fig: Any, path: str) -> None:
    """Render ``fig`` in memory (in the format ``path``'s suffix names) and write it through ``safe_write``."""
    import io
    from pathlib import Path

    from python_native.foundations import safe_write

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format=Path(path).suffix.lstrip(".").lower() or None)
    safe_write.write(Path(path).expanduser(), buffer.getvalue())
