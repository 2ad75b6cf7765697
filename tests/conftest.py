"""Shared pytest fixtures and the tier guard (tests/support/tiers.py)."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from agentsweep.cell.clients.replay import REPLAY_PLOT_VAR

from tests.support import MarkedTree, running_engine_sim
from tests.support.signals import SignalGuard, take_back_sigint
from tests.support.skips import SkipSummary
from tests.support.tiers import TIER_MARKERS, guarded


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipSummary(), "agentsweep-skip-summary")
    config.pluginmanager.register(SignalGuard(), "agentsweep-signal-guard")
    take_back_sigint()


# No cell of the suite opens its replayer's plot (tests/replay/test_replay_engine_sim.py draws one
# through the replayer itself): about 1.5 s of CPU a cell, a tenth of the suite's sweeps.
os.environ.setdefault(REPLAY_PLOT_VAR, "off")

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_TRACES = REPO_ROOT / "kv-cache-tester" / "sample_traces"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """A test without a tier marker may not start a process or open a socket, fixtures included."""
    with guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with guarded(item):
        return (yield)


# Files whose tests drive podman: with the Slurm tests on one worker, as the container tests watch
# every container of the machine (a registry test's container is not a cell's left behind).
PODMAN_TEST_FILES = ("test_images_registry.py", "test_slurm_containers.py")


def xdist_group(item: pytest.Item) -> str | None:
    """The group of tests that share one expensive fixture and so run on one xdist worker
    (``--dist loadgroup``): the session's Slurm clusters (with the other tests that drive podman,
    whose containers the container tests watch), the session's PostgreSQL server, and a
    module's own module-scoped fixture (a real cell or sweep it builds once), which two workers would
    each build."""
    if item.get_closest_marker("slurm") is not None or item.path.name in PODMAN_TEST_FILES:
        return "slurm"  # the Slurm clusters, and the tests that drive podman: one worker, one at a time
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("db_url") == "postgresql":
        return "postgres"
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in info.names_closure:
            defs = info.name2fixturedefs.get(name)
            if (
                defs
                and defs[-1].scope in ("module", "package")
                and "tests" in Path(defs[-1].baseid).parts[:2]
            ):
                return f"module:{Path(defs[-1].baseid).as_posix()}"
    return None


# First: pytest-xdist's worker reads the xdist_group marks in its own collection hook (it appends the
# group to each node id, which is what --dist loadgroup schedules by); marks added after it are ignored.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_expected_length)


def _expected_length(item: pytest.Item) -> int:
    """Longest first (stable: a tier keeps its order). pytest-xdist hands out its groups largest first and
    then single tests in collection order: a whole sweep started last keeps three workers waiting on the
    fourth, while units fill the gaps at the end."""
    if item.get_closest_marker("slow") is not None:
        return 0
    if any(item.get_closest_marker(tier) is not None for tier in TIER_MARKERS):
        return 1
    return 2


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker under --dist loadgroup, every grouped test's id must carry its group (that is
    how pytest-xdist schedules one group on one worker); a pytest that xdist cannot mark this way
    would spread the Slurm, PostgreSQL and module-fixture groups over workers, silently."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with this pytest-xdist drops the xdist_group marks ({lost[0]} has no "
            "@group): install the test extra's pinned range (pip install -e '.[test]')"
        )


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def sample_traces() -> Path:
    return SAMPLE_TRACES


@pytest.fixture
def engine_sim_factory():
    """``with engine_sim_factory("--speed", "50") as url:`` runs a real engine-sim subprocess."""
    return running_engine_sim


@pytest.fixture
def process_tree() -> Iterator[MarkedTree]:
    """A marker for the processes a test starts; whatever carries it is killed at teardown."""
    tree = MarkedTree()
    yield tree
    tree.kill()
