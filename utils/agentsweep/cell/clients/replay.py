"""The trace replayer (`kv-cache-tester replay`): the one place where a cell becomes its flags."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agentsweep.cell.engines import EngineRecipe, fmt_num, recipe
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import replayer_version
from agentsweep.errors import InputError

# The replayer's own grace period (s) for in-flight requests when the duration ends. A simulated engine
# running `speed` times faster finishes them that much sooner, so its cells get a shorter one.
REPLAY_GRACE_S = 30.0
MIN_SIM_GRACE_S = 5.0
# ttft_throughput.png costs the replayer about 1.5 s of CPU (matplotlib) at the end of every run: a
# sweep whose plots nobody opens (a CI's, the test suite's) turns it off in its environment.
REPLAY_PLOT_VAR = "AGENTSWEEP_REPLAY_PLOT"


def replay_plot() -> bool:
    """Whether the replayer draws its plot: $AGENTSWEEP_REPLAY_PLOT ``on`` (unset) or ``off``."""
    value = os.environ.get(REPLAY_PLOT_VAR, "on").strip().lower()
    if value not in ("on", "off"):
        raise InputError(f"${REPLAY_PLOT_VAR}: must be on or off, got {value!r}")
    return value == "on"


def replay_command(
    cell: Cell,
    *,
    endpoint: str,
    output_dir: Path | str,
    python: str = sys.executable,
    tokenizer: str | None = None,
) -> list[str]:
    """argv of the replayer for ``cell`` against ``endpoint`` (``http://HOST:PORT``).

    The simulated engine runs its clock ``speed`` times faster, so think times and delays shrink by
    the same factor. ``max_context`` 0 leaves the replayer's own default.
    """
    argv = [python, "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", endpoint, "--model", cell.model]
    if cell.traces.startswith("hf:"):
        argv += ["--hf-dataset", cell.traces.removeprefix("hf:")]
    else:
        argv += ["--trace-directory", cell.traces]
    argv += [
        "--output-dir",
        str(output_dir),
        "--max-users",
        str(cell.users),
        "--test-duration",
        str(cell.duration),
        "--recycle",
        "--api",
        cell.replay.api,
        "--time-scale",
        fmt_num(1.0 / cell.speed),
        "--no-color",
    ]
    optional: list[tuple[str, object]] = [
        ("--seed", cell.replay.seed),
        ("--warmup-requests-per-user", cell.replay.warmup_requests),
        ("--timing-strategy", cell.replay.timing_strategy),
        ("--max-delay", cell.replay.max_delay),
        ("--advance-min", cell.replay.advance_min),
        ("--advance-max", cell.replay.advance_max),
        ("--max-context", cell.replay.max_context or None),
        ("--system-idle-cap", cell.replay.system_idle_cap or None),
        ("--failed-request-threshold", cell.replay.failed_request_threshold or None),
    ]
    for flag, value in optional:
        if value is not None:
            argv += [flag, fmt_num(value) if isinstance(value, float) else str(value)]
    if cell.speed != 1:
        argv += ["--grace-period", fmt_num(max(MIN_SIM_GRACE_S, REPLAY_GRACE_S / cell.speed))]
    if cell.replay.ignore_eos:
        argv.append("--ignore-eos")
    if cell.replay.warmup_one_token:
        argv.append("--warmup-one-token")
    if not replay_plot():
        argv.append("--no-plot")
    if cell.replay.preset != "none":  # its values are the flags above; named so the summary records it
        argv += ["--preset", cell.replay.preset]
    if not recipe(cell.engine).simulated:
        # A GPU node has cores to spare: a polling client reads each token as it lands instead of
        # adding the OS's wake-up latency to it. A simulated engine shares its few cores with it.
        argv.append("--busy-poll")
    if tokenizer:  # chat: text calibrated to it; completions: token ids from its vocabulary
        argv += ["--tokenizer", tokenizer]
    return argv


class ReplayClient:
    def command(
        self, cell: Cell, *, engine: EngineRecipe, endpoint: str, output_dir: Path, python: str
    ) -> list[str]:
        # A simulated engine needs no tokenizer (its own is word-level).
        tokenizer = None if engine.simulated else cell.model
        return replay_command(
            cell, endpoint=endpoint, output_dir=output_dir, python=python, tokenizer=tokenizer
        )

    def version(self) -> str | None:
        return replayer_version()


CLIENT = ReplayClient()
