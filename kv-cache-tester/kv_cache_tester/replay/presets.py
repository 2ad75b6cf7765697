"""Named replay option sets (``--preset NAME``; ``replay: {preset: NAME}`` in an agentsweep config).

``agentx``: the replay InferenceX runs for its agentic rows (docs/replay-parity.md says where each
value was read, and where this replayer's differs). Each lane starts at a uniformly drawn point between
25% and 75% of its trace; its first request, which sends the whole prefix so far, and then 10 requests
of one output token sent without their delays are warm-up; a delay is capped at 300 s, and whenever
nothing is in flight the pending delays are advanced so that the next request leaves within 10 s;
outputs run to the trace's length (ignore_eos); more than 10% of the profiled requests failing ends the
run; the seed is 42; a run lasts at least 900 s.

A run that departs from its preset (``deviations``) says so by name in its summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "agentx": {
        "advance_min": 0.25,
        "advance_max": 0.75,
        "max_delay": 300.0,
        "system_idle_cap": 10.0,
        "ignore_eos": True,
        "warmup_requests_per_user": 10,
        "warmup_one_token": True,
        "failed_request_threshold": 0.10,
        "seed": 42,
    },
}
MIN_DURATION_S: dict[str, float] = {"agentx": 900.0}
# Options a preset may raise but not lower (more warm-up requests per lane still fit the preset).
AT_LEAST = frozenset({"warmup_requests_per_user"})
# How InferenceX runs beyond the preset's own options: a run that differs says so (its duration, and
# one client process, which the idle cap needs to see every lane).
REFERENCE: dict[str, dict[str, Any]] = {
    "agentx": {"test_duration": 3600.0, "workers": 1, "client_count": 1},
}


def resolve(preset: str, given: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The preset's values for the options left at their defaults; a conflicting one raises ValueError.

    ``given`` holds the options as set (flag names with '_'), ``defaults`` what they are unset.
    """
    out: dict[str, Any] = {}
    for name, value in PRESETS[preset].items():
        current = given.get(name, defaults.get(name))
        if name in given and current != defaults.get(name) and current != value:
            if name in AT_LEAST and current > value:
                continue
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"--preset {preset} sets {flag} {value!r}; drop {flag} {current!r} or the preset"
            )
        out[name] = value
    return out


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def deviations(preset: str, options: Mapping[str, Any]) -> list[str]:
    """Where a run's options (summary.json ``options``: flag names with '_') depart from its preset
    and from how InferenceX runs it, one ``name value (preset|InferenceX value)`` each."""
    out = []
    for name, value in PRESETS[preset].items():
        if name in options and options[name] != value:
            out.append(f"{name} {_shown(options[name])} (preset {_shown(value)})")
    for name, value in REFERENCE[preset].items():
        got = options.get(name, value)
        if got is not None and got != value:
            out.append(f"{name} {_shown(got)} (InferenceX {_shown(value)})")
    return out
