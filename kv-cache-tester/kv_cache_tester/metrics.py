"""One definition of every per-request latency and speed figure (docs/metrics.md repeats them).

Everything that reports these figures (the replayer's summary.json, collect's table, the InferenceX
export, the capacity search's SLO tiers, the dashboard) computes them through this module, so the same
run reads the same number everywhere, here and on InferenceX's dashboard.

Per request (seconds, tokens):

- TTFT: dispatch to the first token.
- E2E: dispatch to the last byte of the response.
- Full-response ITL: ``(E2E - TTFT) / (output tokens - 1)``, the mean gap between tokens after the
  first, counted over the whole response. InferenceX's agentic rows use this one; it is defined for a
  request that streamed at least two tokens.
- TPOT: the same quantity under the name vLLM's benchmark gives it (time per output token after the
  first). Kept as its own key because the replayer reports it per request.
- Output speed: ``1 / full-response ITL`` = ``(output tokens - 1) / (E2E - TTFT)``, tokens per second
  one user sees once the first token arrived.
- E2E per output token: ``E2E / output tokens``, the seconds a user waited per token delivered, the
  wait for the first one included (InferenceX's MODELS.md, "E2E normalized interactivity"); defined
  for a request with a positive E2E and at least one output token.

Per run, at percentile pXX (0-100 scale, linear interpolation between closest ranks):

- Interactivity at pXX = ``1 / (pXX of full-response ITL)``: the slow tail. A high percentile of the
  gap is a low interactivity, so p90 interactivity is what the slowest tenth of requests saw. It is
  NOT the pXX of per-request speeds (that would be the fast tail); taking the percentile of a
  per-request rate the wrong way is a known way to report figures many times too optimistic.
- E2E-normalised interactivity at pXX = ``1 / (pXX of E2E per output token)``: the slow tail, as
  interactivity; it charges each request its queueing and prefill time (about
  ``1 / (TPOT + TTFT / output tokens)``), and is InferenceX's headline x-axis of agentic rows (at p90).
- Throughput per GPU = total tokens per second (input, cached input included, plus output) divided
  by every GPU of the cell; output and input per GPU beside it (``per_gpu``).
- Every latency is reported as a ``Distribution`` (``stats_of``): mean, p50/p75/p90/p95/p99/p99.9 and the population
  standard deviation, in seconds.
- Output speed statistics in SLO tiers are percentiles of the per-request speed itself, so a floor
  on p25 speed says three quarters of requests were at least that fast.

SLO figures (``SLO_FIGURES``): what a service-level constraint may name, each a value per profiled
request and the direction that is better. A percentile pXX of a figure is the value XX % of requests
reach or stay below. For a latency (TTFT, E2E, TPOT: lower is better) a high percentile is the slow
tail: "TTFT p90 <= 10 s" says nine requests in ten got their first token within 10 s. For output
speed (higher is better) a low percentile is the slow tail: "speed p25 >= 20 tok/s" says three
requests in four streamed at least 20 tok/s. The error share is one figure per run (its mean: failed
requests over requests sent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kv_cache_tester.stats import Distribution, percentile

# The percentiles every exported latency carries (InferenceX's set; p50 is exported as "median").
PERCENTILES: tuple[float, ...] = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9)


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool, a string or NaN), else None: the one
    coercion every reader of a result file's figures uses."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def full_response_itl_s(e2e_s: Any, ttft_s: Any, output_tokens: Any) -> float | None:
    """``(E2E - TTFT) / (output tokens - 1)``; None for fewer than two tokens or a missing time."""
    e2e, ttft, out = finite(e2e_s), finite(ttft_s), finite(output_tokens)
    if e2e is None or ttft is None or out is None or out < 2 or e2e < ttft:
        return None
    return (e2e - ttft) / (out - 1)


def output_speed_tok_s(e2e_s: Any, ttft_s: Any, output_tokens: Any) -> float | None:
    """Per-request output speed, ``(output tokens - 1) / (E2E - TTFT)``; None where the full-response
    ITL is None or zero (every token arrived at once)."""
    itl = full_response_itl_s(e2e_s, ttft_s, output_tokens)
    return 1.0 / itl if itl else None


def record_full_response_itl_s(record: Mapping[str, Any]) -> float | None:
    """The full-response ITL of one requests.jsonl record."""
    return full_response_itl_s(record.get("e2e_s"), record.get("ttft_s"), record.get("output_tokens"))


def record_output_speed_tok_s(record: Mapping[str, Any]) -> float | None:
    """The output speed of one requests.jsonl record."""
    return output_speed_tok_s(record.get("e2e_s"), record.get("ttft_s"), record.get("output_tokens"))


def e2e_per_output_token_s(e2e_s: Any, output_tokens: Any) -> float | None:
    """``E2E / output tokens``; None without a positive E2E and at least one output token."""
    e2e, out = finite(e2e_s), finite(output_tokens)
    if e2e is None or out is None or e2e <= 0 or out <= 0:
        return None
    return e2e / out


def record_e2e_per_output_token_s(record: Mapping[str, Any]) -> float | None:
    """The E2E per output token of one requests.jsonl record (or an engine timeline)."""
    return e2e_per_output_token_s(record.get("e2e_s"), record.get("output_tokens"))


def interactivity_tok_s(itl_at_percentile_s: float | None) -> float | None:
    """Interactivity at a percentile from the ITL at that percentile: ``1 / ITL`` (None for none or 0)."""
    return 1.0 / itl_at_percentile_s if itl_at_percentile_s else None


def interactivity_at(full_response_itls_s: Iterable[float], p: float) -> float | None:
    """Interactivity at percentile ``p``: ``1 / (p-th percentile of the full-response ITLs)``."""
    return interactivity_tok_s(percentile(sorted(full_response_itls_s), p))


# --- per-run statistics ------------------------------------------------------------------------

# The statistics every exported latency carries, in export order ("p50" is InferenceX's "median").
STAT_KEYS: tuple[str, ...] = ("mean", "p50", "p75", "p90", "p95", "p99", "p99.9", "std")


def _key(p: float) -> str:
    return f"p{p:g}"


def stats_of(values: Iterable[float]) -> Distribution:
    """Mean, PERCENTILES and the population standard deviation; every entry None without samples."""
    data = sorted(values)
    out: dict[str, float | None] = dict.fromkeys(STAT_KEYS)
    if data:
        mean = math.fsum(data) / len(data)
        out["mean"] = mean
        out["std"] = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / len(data))
        for p in PERCENTILES:
            out[_key(p)] = percentile(data, p)
    return cast(Distribution, out)


def interactivity_stats(itl: Distribution, speeds: Iterable[float] = ()) -> Distribution:
    """Interactivity from an ITL's statistics: ``1 / ITL`` at the mean and at every percentile (a high
    ITL percentile is a low interactivity: the slow tail). ``std`` is the spread of the per-request
    speeds ``1 / ITL`` (None without them), as InferenceX's ``std_intvty`` of agentic rows."""
    source = cast(Mapping[str, float | None], itl)
    out: dict[str, float | None] = {key: interactivity_tok_s(source.get(key)) for key in STAT_KEYS}
    out["std"] = stats_of(speeds)["std"]
    return cast(Distribution, out)


def e2e_norm_interactivity_stats(per_output_token_s: Iterable[float]) -> Distribution:
    """E2E-normalised interactivity from the requests' E2E per output token: ``1 /`` its mean and each
    percentile (the slow tail); ``std`` of the per-request rates ``output tokens / E2E``."""
    values = list(per_output_token_s)
    return interactivity_stats(stats_of(values), (1.0 / v for v in values if v > 0))


# --- throughput per GPU ------------------------------------------------------------------------


def per_gpu(tokens_per_s: float | None, gpus: int | float | None) -> float | None:
    """A throughput divided by every GPU of the cell (prefill, decode and every replica's)."""
    if tokens_per_s is None or not gpus:
        return None
    return tokens_per_s / gpus


def _record_seconds(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    def value(record: Mapping[str, Any]) -> float | None:
        seconds = finite(record.get(key))
        return seconds if seconds is not None and seconds >= 0 else None

    return value


def _record_failed(record: Mapping[str, Any]) -> float | None:
    return 0.0 if record.get("status") == "ok" else 1.0


@dataclass(frozen=True)
class SloFigure:
    """A per-request figure an SLO constraint may name.

    ``value`` reads it from one profiled request record (None: the record has none). ``ok_only``
    figures are read from successful requests only; the error share from every request sent.
    ``clock_power`` says how the figure changes when a simulated engine runs S times faster than the
    wall clock the client measures in: a latency is multiplied by S (1), a rate divided by S (-1), a
    share stays (0).
    """

    name: str
    label: str
    unit: str
    higher_is_better: bool
    value: Callable[[Mapping[str, Any]], float | None]
    ok_only: bool = True
    clock_power: int = 1
    only_mean: bool = False


SLO_FIGURES: dict[str, SloFigure] = {
    "ttft": SloFigure("ttft", "TTFT", "s", False, _record_seconds("ttft_s")),
    "e2e": SloFigure("e2e", "E2E", "s", False, _record_seconds("e2e_s")),
    "tpot": SloFigure("tpot", "TPOT", "s", False, _record_seconds("tpot_s")),
    "output_speed": SloFigure(
        "output_speed", "speed", "tok/s", True, record_output_speed_tok_s, clock_power=-1
    ),
    "error_share": SloFigure(
        "error_share", "errors", "share", False, _record_failed, ok_only=False, clock_power=0, only_mean=True
    ),
}
