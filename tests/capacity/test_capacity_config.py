"""SLO tiers and user searches in a config and on the command line; capacity cells in the matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.commands.allocation import runner_assignments
from agentsweep.config import load_runners, load_sweep
from agentsweep.config.matrix import expand
from agentsweep.contract.cell import Cell
from agentsweep.contract.slo import DEFAULT_TIERS, parse_tier_text

from tests.capacity.conftest import entry

E = "config error: c.yaml:k."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            entry(extra='slo:\n  fast: ["ttfb p90 <= 2 s"]\n'),
            E + "slo.fast[0]: unknown metric 'ttfb' (did you mean 'ttft'?); use one of ttft, e2e, tpot, "
            "output_speed, error_share",
        ),
        (
            entry(extra='slo:\n  fast: ["ttft p100 <= 2 s"]\n'),
            E + "slo.fast[0]: percentile 'p100' is outside p1..p99.9",
        ),
        (
            entry(extra='slo:\n  fast: ["ttft q90 <= 2 s"]\n'),
            E + "slo.fast[0]: unknown statistic 'q90'; use mean or a percentile p1..p99.9 (p25, p90, p99.9)",
        ),
        (
            entry(extra="slo:\n  fast: []\n"),
            E + "slo.fast: an empty tier: give at least one constraint, e.g. 'ttft p90 <= 10 s'",
        ),
        (
            entry(extra="slo: {}\n"),
            E + "slo: no tiers: give at least one, e.g. interactive: ['ttft p90 <= 10 s']",
        ),
        (
            entry(extra='slo:\n  fast: ["speed p25 >= 20 s"]\n'),
            E + "slo.fast[0]: unit 's' does not fit output_speed; use 'tok/s'",
        ),
        (
            entry(users="{search: [16, 2]}"),
            E + "search_space.tp1.users: search range [16, 2]: low 16 > high 2",
        ),
        (
            entry(users="{search: [2, 16], repeat: 3}"),
            E + "search_space.tp1.users.repeat: unknown field (did you mean 'repeats'?)",
        ),
        (entry(users="{search: [0, 16]}"), E + "search_space.tp1.users.search[0]: must be > 0, got 0"),
    ],
    ids=[
        "unknown metric",
        "unknown percentile",
        "unknown statistic",
        "empty tier",
        "no tiers",
        "wrong unit",
        "low > high",
        "misspelt option",
        "zero low",
    ],
)
def test_bad_capacity_config_is_one_line_exit_2(agentsweep, in_tmp: Path, text: str, expected: str) -> None:
    (in_tmp / "c.yaml").write_text(text)
    result = agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--json")
    assert (result.rc, result.out, result.err) == (2, "", expected + "\n")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--slo", "fast ttft p90 <= 2 s"], "input error: --slo 'fast ttft p90 <= 2 s': cannot read"),
        (
            ["--slo", "fast: ttft p0.5 <= 2 s"],
            "input error: --slo 'fast: ttft p0.5 <= 2 s' (fast[0]): percentile",
        ),
        (["--slo", "fast:"], "input error: --slo 'fast:' (fast): an empty tier"),
        (
            ["--slo", "a: ttft p90 <= 1 s", "--slo", "a: e2e p90 <= 9 s"],
            "input error: --slo: tier 'a' given twice",
        ),
        (["--search", "16:2"], "input error: --search '16:2': search range [16, 2]: low 16 > high 2"),
        (["--search", "16"], "input error: --search '16': expected LOW:HIGH"),
    ],
    ids=["no name", "percentile below p1", "empty tier", "twice", "low > high", "no range"],
)
def test_bad_command_line_tiers_and_searches(
    agentsweep, in_tmp: Path, argv: list[str], expected: str
) -> None:
    (in_tmp / "c.yaml").write_text(entry(users="[2, 4]"))
    flags = [a for pair in zip(argv[::2], argv[1::2], strict=True) for a in pair]
    result = agentsweep("matrix", "--config", "c.yaml", "--key", "k", *flags, "--json")
    assert result.rc == 2 and result.out == ""
    assert result.err.startswith(expected) and len(result.err.splitlines()) == 1, result.err


def test_a_search_point_is_one_capacity_cell_per_offload_mode(in_tmp: Path) -> None:
    (in_tmp / "c.yaml").write_text(
        entry(users="{search: [2, 16], repeats: 2, resolution: 0.1}").replace(
            "offload: [off]", "offload: [off, on]"
        )
    )
    cells = expand(load_sweep("c.yaml", "k"), load_runners())
    assert [c.exp_name for c in cells] == ["k-tp1-ep1-u2to16-off", "k-tp1-ep1-u2to16-on"]
    capacity = cells[0].capacity
    assert capacity is not None and cells[0].users == 16
    assert (capacity.low, capacity.high, capacity.repeats, capacity.resolution) == (2, 16, 2, 0.1)
    assert capacity.time_limit_min == load_runners()["local"].time_limit_min
    assert capacity.tiers == DEFAULT_TIERS
    # One JSON value across every process boundary, like any cell.
    assert Cell.parse(cells[0].to_json()) == cells[0]
    assert Cell.parse(json.loads(cells[0].to_json())) == cells[0]


def test_a_config_slo_block_replaces_the_default_tiers_and_slo_flags_replace_it(
    agentsweep, in_tmp: Path
) -> None:
    (in_tmp / "c.yaml").write_text(
        entry(
            extra='slo:\n  mine: ["e2e p99.9 <= 60 s", {metric: error_share, op: "<=", value: 1, unit: "%"}]\n'
        )
    )
    cell = expand(load_sweep("c.yaml", "k"), load_runners())[0]
    assert cell.capacity is not None
    assert [t.describe() for t in cell.capacity.tiers] == ["mine (E2E p99.9 ≤ 60 s, errors ≤ 1 %)"]
    assert cell.capacity.tiers[0].constraints[1].threshold == pytest.approx(0.01)
    result = agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--slo", "x: ttft p50 < 2 s", "--json")
    tiers = json.loads(result.out)["include"][0]["capacity"]["tiers"]
    assert [t["name"] for t in tiers] == ["x"]
    assert parse_tier_text(" x : ttft p50 < 2s").text() == "x: ttft p50 < 2 s"


def test_search_turns_every_point_into_a_capacity_cell(agentsweep, in_tmp: Path) -> None:
    (in_tmp / "c.yaml").write_text(entry(users="[2, 4, 8]"))
    result = agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--search", "4:32", "--json")
    cells = json.loads(result.out)["include"]
    assert [c["exp_name"] for c in cells] == ["k-tp1-ep1-u4to32-off"]
    assert (cells[0]["users"], cells[0]["capacity"]["low"], cells[0]["capacity"]["high"]) == (32, 4, 32)


def test_users_filter_keeps_a_search_whose_range_holds_a_count(agentsweep, in_tmp: Path) -> None:
    (in_tmp / "c.yaml").write_text(entry())
    kept = agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--users", "5", "--json")
    assert len(json.loads(kept.out)["include"]) == 1
    refused = agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--users", "40")
    assert refused.rc == 2 and "2..16 searched" in refused.err


def test_the_dry_run_shows_the_search_its_tiers_the_step_budget_and_the_time_limit(
    agentsweep, in_tmp: Path
) -> None:
    (in_tmp / "c.yaml").write_text(entry(users="{search: [2, 16], time_limit_min: 30}", duration=60))
    table = agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--table").out
    assert "  2..16  " in table
    assert "capacity: search users 2..16 (bracket, then bisect to whole users), 1 run(s) per count" in table
    assert "tier interactive (TTFT p90 ≤ 10 s, speed p25 ≥ 20 tok/s)" in table
    # 30 min - 120 s start-up - 300 s drain = 1380 s of steps of 60 s + 10 s: 19 steps.
    assert "step budget 19 steps of about 70 s within the job's 30 min time limit" in table
    dry = agentsweep("sweep", "--config", "c.yaml", "--key", "k", "--dry-run", "--results", "r").out
    assert "step budget 19 steps" in dry and "POST /reset_prefix_cache" in dry


def test_the_allocation_asks_for_the_capacity_cells_time_limit_and_states_its_budget(in_tmp: Path) -> None:
    (in_tmp / "c.yaml").write_text(entry(users="{search: [2, 16], time_limit_min: 45}", duration=60))
    (capacity,) = expand(load_sweep("c.yaml", "k"), load_runners())
    ordinary = capacity.replace(capacity=None)
    env = {"RESULT_DIR": str(in_tmp / "r")}
    values = runner_assignments("local", capacity, env, None)
    # 45 min - 120 s start-up - 300 s drain = 2280 s of steps of 60 s + 10 s: 32 steps.
    assert values["AS_TIME_LIMIT_MIN"] == "45"
    assert values["AS_STEP_BUDGET"].startswith("step budget 32 steps of about 70 s within the job's 45 min")
    plain = runner_assignments("local", ordinary, env, None)
    # 60 s + 120 s + 300 s, in whole minutes: an ordinary cell's limit follows its duration.
    assert (plain["AS_TIME_LIMIT_MIN"], plain["AS_STEP_BUDGET"]) == ("8", "")


@pytest.mark.parametrize(
    ("users", "runners", "expected"),
    [
        (
            "{search: [2, 16], time_limit_min: 8}",
            "",
            "config error: c.yaml:k.search_space.tp1.users.time_limit_min: a time limit of 8 min holds no "
            "search step: each takes about 70 s after 120 s start-up, and 300 s drain stay aside; give it "
            "at least 9 min (cell k-tp1-ep1-u2to16-off)",
        ),
        (
            "{search: [2, 16]}",
            "time_limit_min: 7",
            "config error: c.yaml:k.runner: 'local' time_limit_min 7: a time limit of 7 min holds no search "
            "step: each takes about 70 s after 120 s start-up, and 300 s drain stay aside; give it at least "
            "9 min (cell k-tp1-ep1-u2to16-off); users.time_limit_min gives the search its own",
        ),
    ],
    ids=["the search's", "the runner's"],
)
def test_a_time_limit_that_holds_no_step_is_refused_by_the_matrix(
    agentsweep,
    in_tmp: Path,
    repo_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    users: str,
    runners: str,
    expected: str,
) -> None:
    (in_tmp / "c.yaml").write_text(entry(users=users, duration=60))
    if runners:  # the shipped runners, the local one's time limit changed
        shipped = (repo_root / "configs" / "runners.yaml").read_text()
        local = shipped.index("\nlocal:")
        changed = shipped[:local] + shipped[local:].replace("time_limit_min: 60", runners, 1)
        (in_tmp / "runners.yaml").write_text(changed)
        monkeypatch.setenv("AGENTSWEEP_RUNNERS", str(in_tmp / "runners.yaml"))
    for command in ("matrix", "preflight"):
        refused = agentsweep(command, "--config", "c.yaml", "--key", "k")
        assert (refused.rc, refused.err.strip()) == (2, expected)


def test_preflight_of_a_capacity_cell_says_whether_its_time_limit_holds_a_step(in_tmp: Path) -> None:
    from agentsweep.preflight.run import capacity_checks

    (in_tmp / "c.yaml").write_text(entry(users="{search: [2, 16], time_limit_min: 30}", duration=60))
    (cell,) = expand(load_sweep("c.yaml", "k"), load_runners())
    (ok,) = capacity_checks([cell, cell.replace(capacity=None)], {})
    assert (ok.name, ok.status) == ("capacity", "PASS") and "step budget 19 steps" in ok.detail
    assert cell.capacity is not None
    short = cell.replace(capacity=cell.capacity.model_copy(update={"time_limit_min": 8}))
    (bad,) = capacity_checks([short], {})
    assert (bad.name, bad.status) == ("capacity", "FAIL")
    assert "a time limit of 8 min holds no search step" in bad.detail and "time_limit_min" in bad.fix
    # The margins are the node's: with none for start-up and drain, 8 min hold six steps of 70 s.
    (fits,) = capacity_checks([short], {"AGENTSWEEP_STARTUP_MARGIN_S": "0", "AGENTSWEEP_DRAIN_MARGIN_S": "0"})
    assert fits.status == "PASS" and "step budget 6 steps" in fits.detail


@pytest.mark.parametrize("command", ["matrix", "sweep"])
def test_seventeen_slo_tiers_are_one_line(agentsweep, in_tmp: Path, command: str) -> None:
    (in_tmp / "c.yaml").write_text(entry())
    tiers = [a for i in range(17) for a in ("--slo", f"t{i}: ttft p90 <= 1 s")]
    extra = ["--dry-run", "--results", "r"] if command == "sweep" else ["--json"]
    result = agentsweep(command, "--config", "c.yaml", "--key", "k", *tiers, *extra)
    assert (result.rc, result.err) == (2, "input error: --slo given 17 times: at most 16 tiers\n")
    sixteen = agentsweep(command, "--config", "c.yaml", "--key", "k", *tiers[:32], *extra)
    assert sixteen.rc == 0, sixteen.err


@pytest.mark.parametrize("command", ["matrix", "sweep"])
def test_search_given_twice_is_refused_not_the_last_one_kept(agentsweep, in_tmp: Path, command) -> None:
    (in_tmp / "c.yaml").write_text(entry(users="[2, 4]"))
    with pytest.raises(SystemExit) as stop:
        agentsweep(command, "--config", "c.yaml", "--key", "k", "--search", "2:4", "--search", "2:16")
    assert stop.value.code == 2


def test_search_given_twice_says_which(in_tmp: Path, capsys) -> None:
    from agentsweep.cli import main

    (in_tmp / "c.yaml").write_text(entry(users="[2, 4]"))
    with pytest.raises(SystemExit):
        main(["matrix", "--config", "c.yaml", "--key", "k", "--search", "2:4", "--search", "2:16"])
    assert capsys.readouterr().err == (
        "usage error: agentsweep matrix: --search given twice ('2:4', then '2:16'): give it once (see --help)\n"
    )


def test_slo_tiers_no_cell_would_use_are_refused(agentsweep, in_tmp: Path) -> None:
    """Tiers are read by capacity cells, and by collect's grid-derived capacity of a series of two or more
    user counts: a selection with neither would ignore them."""
    slo = ("--slo", "x: ttft p90 <= 2 s")
    (in_tmp / "c.yaml").write_text(entry(users="[4]"))
    for command, extra in (("matrix", ["--json"]), ("sweep", ["--dry-run", "--results", "r"])):
        result = agentsweep(command, "--config", "c.yaml", "--key", "k", *slo, *extra)
        assert result.rc == 2 and result.out == ""
        assert result.err == (
            "input error: --slo: no selected cell searches its users and no series has two user counts for "
            "a grid-derived capacity, so no tier would be used; add --search LOW:HIGH (or select a key whose "
            "users search, users: {search: [LOW, HIGH]})\n"
        )
        assert (
            agentsweep(command, "--config", "c.yaml", "--key", "k", *slo, "--search", "2:8", *extra).rc == 0
        )
    # A grid of two user counts: collect reads its capacity against the tiers (sweep passes them on).
    (in_tmp / "c.yaml").write_text(entry(users="[2, 4]"))
    dry = agentsweep("sweep", "--config", "c.yaml", "--key", "k", *slo, "--dry-run", "--results", "r")
    assert dry.rc == 0 and "--slo 'x: ttft p90 <= 2 s'" in dry.out
    # --users leaving one count of the grid: nothing would read the tiers.
    assert agentsweep("matrix", "--config", "c.yaml", "--key", "k", "--users", "2", *slo).rc == 2
