"""Named replay option sets (``--preset NAME``; ``replay: {preset: NAME}`` in an agentsweep config).

``agentx``: the settings of InferenceX's agentic runs. Each lane starts at a uniformly drawn point
between 25% and 75% of its trace (its first request, which sends the whole prefix so far, is a
warm-up), idle gaps are capped at 10 s, outputs run to the trace's length (ignore_eos), and a run
lasts at least 900 s.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "agentx": {
        "advance_min": 0.25,
        "advance_max": 0.75,
        "max_delay": 10.0,
        "ignore_eos": True,
        "warmup_requests_per_user": 1,
    },
}
MIN_DURATION_S: dict[str, float] = {"agentx": 900.0}
# Options a preset may raise but not lower (more warm-up requests per lane still fit the preset).
AT_LEAST = frozenset({"warmup_requests_per_user"})


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
