"""One preflight check's outcome, and the report they make (lines for people, JSON for tools).

Stdlib only: the node checks (agentsweep.preflight.node) build these on the nodes too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Check:
    """``name`` (``slurm.partition``, ``node.gpus``...), its status, what was found, and for a FAIL
    the fix; ``node`` names the node a node check ran on."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    node: str = ""

    def line(self) -> str:
        where = f" [{self.node}]" if self.node else ""
        text = f"{self.status:<4}  {self.name:<18} {self.detail}{where}"
        return f"{text}; fix: {self.fix}" if self.fix and self.status == "FAIL" else text

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> Check:
        status = data.get("status", "FAIL")
        return cls(
            name=str(data.get("name", "?")),
            status=status if status in ("PASS", "FAIL", "SKIP") else "FAIL",  # type: ignore[arg-type]
            detail=str(data.get("detail", "")),
            fix=str(data.get("fix", "")),
            node=str(data.get("node", "")),
        )


def passed(name: str, detail: str, node: str = "") -> Check:
    return Check(name, "PASS", detail, node=node)


def failed(name: str, detail: str, fix: str, node: str = "") -> Check:
    return Check(name, "FAIL", detail, fix, node)


def skipped(name: str, why: str, node: str = "") -> Check:
    return Check(name, "SKIP", why, node=node)


@dataclass(frozen=True)
class Report:
    """Every check of one preflight run, in the order they ran."""

    subject: str
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "FAIL"]

    @property
    def exit_code(self) -> int:
        return 2 if self.failures else 0

    def summary(self) -> str:
        counts = {s: sum(1 for c in self.checks if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
        verdict = "ready" if not self.failures else "NOT ready"
        return f"preflight {self.subject}: {verdict} ({counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP)"

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks] + [self.summary()]

    def to_json(self) -> str:
        return json.dumps(
            {"subject": self.subject, "ok": not self.failures, "checks": [c.to_dict() for c in self.checks]},
            indent=2,
        )
