"""Every skip said at the end of a run, by reason and tier, with what installs the missing part.

A test skips when a part it drives for real is not on the machine (Slurm, PostgreSQL, Chromium, a
registry, podman, an optional Python package). A newcomer should not have to read 1,600 lines of
``s`` to learn that 34 Slurm tests never ran: the summary names each missing Debian package of
``.ci/apt-packages.txt`` and the command that installs them (``make test-deps``). Under CI
(``CI=true``) a skip is a failure: the CI machine installs every part, so a skip there means a test
that did not run and nobody noticed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

TIERS = ("slurm", "chromium", "engine_parsers", "slow", "integration")
APT_PACKAGES = Path(__file__).resolve().parents[2] / ".ci" / "apt-packages.txt"


def tier(keywords: object) -> str:
    """The tier a test report belongs to, from its markers (a test with none is a unit test)."""
    names = set(keywords) if isinstance(keywords, dict | set | list | tuple) else set()
    return next((t for t in TIERS if t in names), "unit")


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return re.sub(r"^Skipped: ", "", str(text)).strip()


def apt_packages(path: Path = APT_PACKAGES) -> list[str]:
    """The Debian packages .ci/apt-packages.txt names."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            out.append(name)
    return out


def missing_apt_packages(packages: list[str]) -> list[str] | None:
    """Which of ``packages`` dpkg does not list as installed; None where there is no dpkg."""
    if shutil.which("dpkg-query") is None:
        return None
    missing = []
    for name in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False
        )
        if "install ok installed" not in proc.stdout:
            missing.append(name)
    return missing


class SkipSummary:
    """The pytest plugin: counts skips as reports arrive (from xdist workers too), says them at the
    end, and fails the session under CI when any test skipped."""

    def __init__(self) -> None:
        self.skips: Counter[tuple[str, str]] = Counter()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips[(tier(report.keywords), skip_reason(report))] += 1

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.skips and os.environ.get("CI") == "true" and exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.skips:
            return
        write = terminalreporter.write_line
        terminalreporter.section("skipped: what did not run, and why")
        for (tier_name, reason), count in sorted(self.skips.items(), key=lambda kv: (-kv[1], kv[0])):
            write(f"{count:5d}  {tier_name:<14} {reason}")
        total = sum(self.skips.values())
        missing = missing_apt_packages(apt_packages())
        if missing:
            write(f"{total} tests skipped; Debian packages missing: {' '.join(missing)}")
            write("  install them with: make test-deps  (apt-get install of .ci/apt-packages.txt)")
        else:
            write(f"{total} tests skipped (every Debian package of .ci/apt-packages.txt is installed)")
        if os.environ.get("CI") == "true":
            write("CI=true: a skip fails the run (CI installs every part, so nothing may skip)")
