"""What the report must show for every kernel at the target, and the findings where it does not.

Checks, per benchmark row:

- ``spill``: a launch's kernel uses local memory (ptxas spilled registers);
- ``traffic``: a call moves more than ``MAX_TRAFFIC_RATIO`` x its op's minimum bytes;
- ``warps``: a launch that moves at least ``MAIN_SHARE`` of its call's bytes lets an SM hold fewer
  than ``MIN_RESIDENT_WARPS`` warps (``model.WARPS_FOR_BANDWIDTH``: the warps a memory-bound kernel
  needs to keep enough loads in flight for the copy bandwidth);
- ``int32``: a launch's kernel computes an address in int32 arithmetic that can pass 2**31
  (``offsets``: a program id or an int argument times a block or a stride, before any cast to
  int64); each site is made int64 in the kernel or excused with the cond's bound that keeps the
  op's calls below it (tested at that size by ``tests/triton/test_int32_edges.py``);
- ``unmeasured``: a figure could not be obtained (compile or byte count failed).

A finding that an entry of ``exceptions.EXCEPTIONS`` matches is excused; an entry that matches no
finding although its kernel was checked is itself a finding (``stale``), so the file only lists
what still applies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from python_native.tools.kernel_report.exceptions import EXCEPTIONS, Excuse
from python_native.tools.kernel_report.model import WARPS_FOR_BANDWIDTH

MAX_TRAFFIC_RATIO = 1.10
MIN_RESIDENT_WARPS = WARPS_FOR_BANDWIDTH
MAIN_SHARE = 0.10


@dataclass
class Finding:
    check: str  # spill | traffic | warps | int32 | unmeasured | stale
    kernel: str  # the kernel's name (traffic: the aten op's symbol)
    case: str  # "label dtype"
    measured: str
    excused: Excuse | None = None

    def __str__(self) -> str:
        state = f"excused: {self.excused.reason}" if self.excused else "OPEN"
        return f"[{self.check}] {self.kernel} at {self.case}: {self.measured} ({state})"


def _case_findings(case: dict) -> Iterable[Finding]:
    where = f"{case['label']} {case['dtype']}"
    for call in case["calls"]:
        ratio = call.get("ratio")
        if ratio is not None and ratio > MAX_TRAFFIC_RATIO:
            yield Finding("traffic", call["op"], where, f"{ratio:.2f}x the minimum (limit {MAX_TRAFFIC_RATIO}x)")
        for launch in call["launches"]:
            fig = launch.get("compiled", {})
            for site in fig.get("int32", ()):
                yield Finding("int32", launch["kernel"], where, site)
            if "int32_error" in fig:
                yield Finding("unmeasured", launch["kernel"], where, f"int32 sites: {fig['int32_error']}")
            if "error" in fig or "bytes_error" in launch:
                yield Finding("unmeasured", launch["kernel"], where, fig.get("error") or launch["bytes_error"])
                continue
            if fig["local"]:
                yield Finding("spill", launch["kernel"], where, f"{fig['local']} B/thread of local memory")
            share = launch["bytes"] / call["bytes"] if call.get("bytes") else 1.0
            resident = launch["occupancy"]["resident_warps"]
            if share >= MAIN_SHARE and resident < MIN_RESIDENT_WARPS:
                yield Finding("warps", launch["kernel"], where,
                              f"{resident} resident warps/SM (< {MIN_RESIDENT_WARPS}; {launch['occupancy']['limit']})")


def _kernels(case: dict) -> set[str]:
    names = set()
    for call in case["calls"]:
        names.add(call["op"])
        names.update(launch["kernel"] for launch in call["launches"])
    return names


def check(report: dict, exceptions: Iterable[Excuse] = EXCEPTIONS) -> list[Finding]:
    """Every finding of ``report``, excused where an exception matches, plus stale exceptions."""
    exceptions = list(exceptions)
    used: set[int] = set()
    in_scope: set[int] = set()
    findings: list[Finding] = []
    for case in report["cases"]:
        kernels = _kernels(case)
        for i, ex in enumerate(exceptions):
            if ex.kernel in kernels and ex.covers(case["label"], case["dtype"]):
                in_scope.add(i)
        for finding in _case_findings(case):
            for i, ex in enumerate(exceptions):
                if ex.matches(finding) and ex.covers(case["label"], case["dtype"]):
                    finding.excused = ex
                    used.add(i)
                    break
            findings.append(finding)
    for i in sorted(in_scope - used):
        ex = exceptions[i]
        if ex.check == "traffic" and not report.get("bytes_counted", True):
            continue  # not evaluated in this report (``inspect --no-bytes``)
        findings.append(Finding("stale", ex.kernel, ex.scope(), f"listed for {ex.check!r} but no longer found"))
    return findings


def open_findings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.excused is None]
