"""status.txt: the verdict on the first line (SUCCESS | INVALID | FAILED), one reason per line after it.

It is what the local sweep's resume and the workflow read, so it stays plain text.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from agentsweep.contract.resultdir.fileio import exists, read_bytes, write_atomic
from agentsweep.contract.resultdir.files import STATUS_TXT
from agentsweep.contract.verdict import VERDICTS, Verdict
from agentsweep.errors import ResultFileError, WriteError


class CellStatus(BaseModel):
    """A verdict and its reasons (one line each, without line breaks)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    verdict: Verdict
    reasons: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_line_each(self) -> CellStatus:
        for reason in self.reasons:
            if not reason.strip() or "\n" in reason or "\r" in reason:
                raise ValueError(f"a reason must be one non-empty line, got {reason[:60]!r}")
        return self

    @property
    def reason(self) -> str | None:
        """The first reason, or None."""
        return self.reasons[0] if self.reasons else None

    def to_text(self) -> str:
        return "".join(f"{line}\n" for line in [self.verdict, *self.reasons])


def write_status(result_dir: Path, status: CellStatus) -> None:
    """status.txt. A SUCCESS has no reason; INVALID and FAILED have at least one."""
    if (status.verdict == "SUCCESS") != (not status.reasons):
        raise ValueError(
            f"{status.verdict} needs {'no' if status.verdict == 'SUCCESS' else 'at least one'} reason"
        )
    write_atomic(result_dir / STATUS_TXT, status.to_text())


def read_status(result_dir: Path) -> CellStatus | None:
    """status.txt of ``result_dir``, None when absent; ResultFileError when it is not a regular file
    of at most its declared size (a FIFO would block the reader) or its first line is no verdict.

    A written INVALID or FAILED without a reason (a launcher's own) reads as one without reasons.
    """
    raw = read_bytes(result_dir, STATUS_TXT)
    if raw is None:
        return None
    lines = raw.decode("utf-8", "replace").splitlines()
    first = lines[0].strip() if lines else ""
    if first not in VERDICTS:
        raise ResultFileError(f"{STATUS_TXT}: first line {first[:40]!r}, expected {' or '.join(VERDICTS)}")
    reasons = tuple(line.strip() for line in lines[1:] if line.strip())
    return CellStatus.model_validate({"verdict": first, "reasons": reasons})


def mark_failed(result_dir: Path, reason: str) -> bool:
    """status.txt of ``result_dir`` saying FAILED and ``reason``; False when one was there already."""
    if exists(result_dir / STATUS_TXT):
        return False
    line = " ".join(reason.split()) or "the launcher stopped before the cell ran"
    try:
        result_dir.mkdir(parents=True, exist_ok=True)
        write_status(result_dir, CellStatus(verdict="FAILED", reasons=(line,)))
    except OSError as err:
        raise WriteError(result_dir / STATUS_TXT, err) from None
    return True
