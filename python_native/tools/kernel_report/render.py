"""The report as text: one line per kernel launch of each benchmark row, then how each figure was obtained."""

from __future__ import annotations


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _launch_line(launch: dict) -> str:
    fig = launch.get("compiled", {})
    if "error" in fig:
        compiled = f"compile failed: {fig['error']}"
    else:
        occ, w = launch["occupancy"], launch["waves"]
        compiled = (f"regs {fig['regs']:>3}  spill {fig['local']:>3} B  smem {fig['shared'] / 1024:>5.1f} KB  "
                    f"warps {fig['num_warps']:>2}  resident {occ['resident_warps']:>2} ({occ['limit']})  "
                    f"waves {w['waves']:>6.2f} tail {w['tail']:.2f}")
    bytes_ = _bytes(launch["bytes"]) if "bytes" in launch else launch.get("bytes_error", "bytes not counted")
    return f"    {launch['kernel']:<34} programs {launch['programs']:>7}  {compiled}  {bytes_}"


def render(report: dict, findings: list | None = None) -> str:
    """Plain text of ``collect``'s report, with ``checks`` findings (if given) at the end."""
    out = [f"kernel report for {report['arch']} ({report['gpu']}, {report['sm_count']} SMs, "
           f"{report['bandwidth_gbps']:.0f} GB/s)"]
    for case in report["cases"]:
        predicted = case.get("predicted_copy_fraction")
        tail = f"  predicted {case['predicted_us']} us, {predicted:.0%} of copy bandwidth" if predicted else ""
        out.append(f"{case['label']} {case['dtype']}{tail}")
        for call in case["calls"]:
            if call["declined"]:
                out.append(f"  {call['op']}: declined by the override's cond (aten runs)")
                continue
            ratio = call.get("ratio")
            traffic = (f"{_bytes(call['bytes'])} moved / {_bytes(call['minimum'])} minimum = {ratio:.2f}x"
                       if ratio else "traffic not counted")
            out.append(f"  {call['op']} ({call['family']}): {traffic}")
            out.extend(_launch_line(launch) for launch in call["launches"])
        if not case["calls"]:
            out.append("  no Triton override takes this row's calls")
    out.append("")
    out.append("how each figure was obtained:")
    out.extend(f"  {name}: {text}" for name, text in report["methods"].items())
    out.append(f"took {report['seconds']['plans_and_bytes']} s to plan and count bytes, "
               f"{report['seconds']['compile']} s to compile")
    if findings is not None:
        out.append("")
        out.append(f"checks: {len([f for f in findings if not f.excused])} open, "
                   f"{len([f for f in findings if f.excused])} excused")
        out.extend(f"  {f}" for f in findings)
    return "\n".join(out)
