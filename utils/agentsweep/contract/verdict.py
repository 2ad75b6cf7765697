"""A cell's verdict and the validity record behind it (status.txt, summary.json ``validity``).

SUCCESS: the cell ran to the end and passed every check. INVALID: it ran, but a check failed; the
reasons follow on status.txt's next lines. FAILED: it did not run to the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

Verdict = Literal["SUCCESS", "INVALID", "FAILED"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
# The exit status of `agentsweep sweep` and `collect` when every cell ran but some are INVALID.
INVALID_EXIT = 3


@dataclass(frozen=True)
class Check:
    """One check: the measured value, its limit, whether it passed, what it says when it did not, and
    why a passed check was not judged (``note``: summary.json keeps it, so a check without a figure
    says why rather than pass silently)."""

    value: float | None
    limit: float | None
    ok: bool
    reason: str = ""  # one line: what a failed check says (summary.json keeps it only when ok is False)
    note: str = ""  # one line: why the check passed without judging ("not judged: ...")

    def to_dict(self) -> dict[str, float | bool | str | None]:
        out: dict[str, float | bool | str | None] = {"value": self.value, "limit": self.limit, "ok": self.ok}
        if not self.ok:
            out["reason"] = self.reason
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class Validity:
    """Every check of one cell, in the order they ran."""

    checks: dict[str, Check] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return all(check.ok for check in self.checks.values())

    @property
    def reasons(self) -> list[str]:
        return [f"{name}: {check.reason}" for name, check in self.checks.items() if not check.ok]

    def to_dict(self) -> dict[str, object]:
        """The ``validity`` object of summary.json."""
        return {
            "valid": self.valid,
            "reasons": self.reasons,
            "checks": {name: check.to_dict() for name, check in self.checks.items()},
        }
