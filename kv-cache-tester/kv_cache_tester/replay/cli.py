"""`kv-cache-tester replay` (also `python kv-cache-tester/trace_replay_tester.py`).

Flag names and meanings follow the original trace_replay_tester.py as InferenceX used it; users are
fixed (no ramp): --max-users lanes all start together (--start-users is accepted; it only matters
when --max-users is not given).
"""

from __future__ import annotations

import argparse

from kv_cache_tester.replay.config import from_args, options_dict
from kv_cache_tester.replay.memory import DEFAULT_PROMPT_MEMORY_GIB, MAX_PROMPT_TOKENS
from kv_cache_tester.replay.presets import PRESETS
from kv_cache_tester.replay.timing import STRATEGIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("source and target")
    g.add_argument("--api-endpoint", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    g.add_argument("--trace-directory", help="directory (or file) of trace JSON/JSONL files")
    g.add_argument("--hf-dataset", help="Hugging Face dataset <org>/<name> of traces")
    g.add_argument("--output-dir", required=True, help="where requests.jsonl, summary.json, the plot go")
    g.add_argument("--model", help="model name to send (default: the first one /v1/models lists)")
    g.add_argument(
        "--api",
        choices=("chat", "completions"),
        default="chat",
        help="endpoint (completions sends token ids)",
    )
    g.add_argument(
        "--tokenizer",
        help="the served model's tokenizer.json path/folder or HF model id: with --api chat, text "
        "calibrated to it (default: one word = one token, for the simulated engine); with --api "
        "completions, token ids from its vocabulary (default: ids below the vocabulary size the server "
        "reports at /v1/models; refused when it reports none)",
    )

    g = p.add_argument_group("users")
    g.add_argument(
        "--start-users", type=int, help="accepted for compatibility; users are fixed at --max-users"
    )
    g.add_argument("--max-users", type=int, help="concurrent users (lanes), all started together")
    g.add_argument("--recycle", action="store_true", help="a lane that finishes its trace takes the next one")
    g.add_argument("--seed", type=int, default=0, help="trace assignment, advance and content seed")
    g.add_argument(
        "--workers", type=int, default=1, help="processes to spread the lanes over (past one core)"
    )
    g.add_argument(
        "--max-concurrent-requests", type=int, default=0, help="cap on requests in flight (0 = unlimited)"
    )
    g.add_argument(
        "--client-count",
        type=int,
        default=1,
        help="one of this many client processes (on several nodes) that make one run together: "
        "each runs the lanes and traces whose index modulo the count is its --client-index, and "
        "kv_cache_tester.replay.merge joins their output directories",
    )
    g.add_argument("--client-index", type=int, default=0, help="this process's index (0..--client-count-1)")
    g.add_argument(
        "--start-at",
        type=float,
        default=None,
        help="Unix time to start dispatching at (one common start instant for every client process)",
    )

    g = p.add_argument_group("timing")
    g.add_argument("--test-duration", type=float, help="wall seconds from the start (default: until done)")
    g.add_argument("--timing-strategy", choices=STRATEGIES, default="think-only")
    g.add_argument("--max-delay", type=float, default=60.0, help="cap on one delay, trace seconds")
    g.add_argument(
        "--system-idle-cap",
        type=float,
        default=0.0,
        help="when no request is in flight, advance every pending delay so the next request leaves "
        "within this many trace seconds (x --time-scale; per process); 0 = off",
    )
    g.add_argument("--time-scale", type=float, default=1.0, help="multiplies every delay (0.02 = 50x faster)")
    g.add_argument("--api-time-scale", type=float, default=1.0, help="api_time factor of api-scaled timing")
    g.add_argument("--advance-min", type=float, default=0.0, help="min fraction of a trace to skip at start")
    g.add_argument("--advance-max", type=float, default=0.0, help="max fraction of a trace to skip at start")
    g.add_argument(
        "--warmup-requests-per-user",
        type=int,
        default=0,
        help="first requests of each lane recorded as warmup (an advanced lane's first one always is)",
    )
    g.add_argument(
        "--warmup-one-token",
        action="store_true",
        help="each lane's first request (the whole prefix so far) is warm-up, then --warmup-requests-per-"
        "user requests of one output token sent without their delays",
    )
    g.add_argument(
        "--failed-request-threshold",
        type=float,
        default=0.0,
        help="end the run (exit 1) once more than this share of at least 20 finished profile requests "
        "failed; 0 = never",
    )
    g.add_argument("--request-timeout", type=float, default=3600.0, help="seconds per request")
    g.add_argument("--grace-period", type=float, default=30.0, help="seconds to let requests finish at stop")
    g.add_argument(
        "--stall-timeout",
        type=float,
        default=300.0,
        help="a started stream that sends nothing for this long fails as 'stall' (0 = off)",
    )
    g.add_argument(
        "--max-event-bytes",
        type=int,
        default=4 << 20,
        help="longest SSE event accepted; a longer one is a 'protocol' error (default 4 MiB)",
    )
    g.add_argument(
        "--busy-poll",
        action="store_true",
        help="keep the client polling while requests are in flight (no OS wake-up latency in the "
        "timings; one busy core per worker)",
    )

    g = p.add_argument_group("requests")
    g.add_argument(
        "--max-context",
        type=int,
        default=128000,
        help=f"cut traces at the first longer request (0: at the replayer's limit, {MAX_PROMPT_TOKENS})",
    )
    g.add_argument(
        "--max-prompt-memory",
        type=float,
        default=DEFAULT_PROMPT_MEMORY_GIB,
        help="GiB of prompts the run may hold at once (users x longest prompts); a run that could "
        "need more is refused before it starts",
    )
    g.add_argument(
        "--ignore-eos", action="store_true", help="send ignore_eos so outputs have the trace's length"
    )
    g.add_argument("--no-max-tokens", action="store_true", help="send no max_tokens (the model decides)")
    g.add_argument(
        "--hash-block-mode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prompt content from hash ids (default; the only mode)",
    )

    g = p.add_argument_group("reporting")
    g.add_argument("--slo-ttft", type=float, help="TTFT SLO (s) for goodput")
    g.add_argument("--slo-tpot", type=float, help="TPOT SLO (s) for goodput")
    g.add_argument(
        "--stability-subwindow",
        type=float,
        default=600.0,
        help="length (s) of the stability block's sub-windows; a third of the window when that is shorter",
    )
    g.add_argument("--max-ttft", type=float, default=2.0, help="progress line shows p50 TTFT above it in red")
    g.add_argument(
        "--max-new-tokens-per-period",
        type=int,
        default=0,
        help="accepted for compatibility (ramp budget; users are fixed)",
    )
    g.add_argument("--debug-trace", action="store_true", help="stream raw SSE chunks to debug_trace.jsonl")
    g.add_argument("--no-color", action="store_true", help="no ANSI colors in the progress line")
    g.add_argument("--no-plot", action="store_true", help="skip ttft_throughput.png")
    g.add_argument("--progress-interval", type=float, default=1.0, help=argparse.SUPPRESS)

    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a named option set: agentx = InferenceX's agentic runs (lanes start 25-75%% into their trace, "
        "warm up with 10 one-token requests each, delays capped at 300 s, the whole system never idle "
        "over 10 s, ignore_eos, a 10%% failed-request limit, seed 42, at least 900 s; "
        "docs/replay-parity.md); it fills the options you leave unset and refuses ones that contradict it",
    )
    # What each preset option is when left unset (the preset only replaces those).
    p.set_defaults(
        preset_defaults={name: p.get_default(name) for preset in PRESETS.values() for name in preset}
    )


def run(args: argparse.Namespace) -> int:
    from kv_cache_tester.replay.app import replay

    cfg = from_args(args)
    return replay(cfg, options_dict(args))
