"""``PatchReport``: what ``pn.patch`` did to a model, module class by module class.

Each entry is one rule on one target (a module class, or a module-level function) with a status:
``"patched"`` (the instances routed, and how), ``"left alone"`` (recognised, and why not routed)
or ``"would patch"`` (``dry_run=True``). A routed entry also says what serves its calls on the
model's device as patched (``serves``): an override of its op, or, where none is active there, the
module's own code and why (a routed call runs the op only where an override serves it).
``str(report)`` is the table, followed by what serves each routed entry where one of them runs its
own code; ``to_dict()`` plain data.
"""

from __future__ import annotations

import dataclasses
from typing import Any

STATUSES = ("patched", "would patch", "left alone")
OWN_CODE = "its own code"  # how ``serves`` begins where no override serves a routed entry


@dataclasses.dataclass
class PatchEntry:
    """One rule on one target: ``target`` is a module class name, or ``module.function`` for a
    function rule; ``modules`` the qualified names of the instances (for a function, its callers)."""

    rule: str
    target: str
    kind: str  # "module" or "function"
    status: str
    detail: str  # how it is routed, or why it is left alone
    modules: list[str] = dataclasses.field(default_factory=list)
    ops: tuple[str, ...] = ()
    custom_ops: tuple[str, ...] = ()  # routed entries: the custom ops an override must serve for a call to take
    serves: str = ""  # routed entries: what serves their calls on the model's device, and why

    @property
    def instances(self) -> int:
        return len(self.modules)


@dataclasses.dataclass
class PatchReport:
    """What one ``pn.patch`` call found in ``model`` (its class name) and did."""

    model: str
    entries: list[PatchEntry] = dataclasses.field(default_factory=list)

    def add(self, rule: str, target: str, kind: str, status: str, detail: str, module: str,
            ops: tuple[str, ...] = (), custom_ops: tuple[str, ...] = ()) -> None:
        for entry in self.entries:
            if (entry.rule, entry.target, entry.status, entry.detail) == (rule, target, status, detail):
                entry.modules.append(module)
                return
        self.entries.append(PatchEntry(rule, target, kind, status, detail, [module], ops, custom_ops))

    @property
    def own_code(self) -> list[PatchEntry]:
        """Routed entries whose calls run the module's own code on the model's device (no override serves)."""
        return [e for e in self.patched if e.serves.startswith(OWN_CODE)]

    @property
    def patched(self) -> list[PatchEntry]:
        return [e for e in self.entries if e.status != "left alone"]

    @property
    def left_alone(self) -> list[PatchEntry]:
        return [e for e in self.entries if e.status == "left alone"]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "entries": [dataclasses.asdict(e) | {"instances": e.instances} for e in self.entries]}

    def table(self) -> str:
        header = ("rule", "target", "status", "instances", "how / why")
        rows = [(e.rule, e.target, e.status, str(e.instances), e.detail)
                for e in sorted(self.entries, key=lambda e: (STATUSES.index(e.status), e.rule, e.target))]
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
        return "\n".join(lines)

    def __str__(self) -> str:
        if not self.entries:
            return f"pn.patch({self.model}): no rule recognised any module or function"
        text = f"pn.patch({self.model}):\n{self.table()}"
        if self.own_code:
            text += "\n\nserved by:\n" + "\n".join(f"  {e.rule} ({e.target}): {e.serves}" for e in self.patched)
        return text

    __repr__ = __str__
