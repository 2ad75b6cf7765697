"""One finished request as its requests.jsonl record (the ``RequestRecord`` contract)."""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache_tester.replay.client import Outcome
from kv_cache_tester.replay.results import Phase, RequestError, RequestRecord, itl_summary


@dataclass(slots=True)  # not frozen: one is made for every request, and frozen ones cost more to make
class Sent:
    """What the replayer knew of a request when it sent it (times in seconds from the run start)."""

    trace_id: str
    session_id: str
    user: int
    turn: int
    phase: Phase
    play: int
    salt: str
    request_id: str
    t_dispatch: float
    dispatch_lag_s: float
    expected_prompt_tokens: int
    expected_output_tokens: int
    total_blocks: int


def request_record(sent: Sent, out: Outcome, t_done: float, hit_blocks: int) -> RequestRecord:
    """The record of a request sent as ``sent`` that ended as ``out``; ``hit_blocks``: the leading
    blocks that accepted requests of its scope held when it was sent."""
    server_prompt = out.prompt_tokens is not None
    record: RequestRecord = {
        "trace_id": sent.trace_id,
        "session_id": sent.session_id,
        "user": sent.user,
        "turn": sent.turn,
        "phase": sent.phase,
        "play": sent.play,
        "salt": sent.salt,
        "request_id": sent.request_id,
        "t_dispatch": sent.t_dispatch,
        "t_done": t_done,
        "dispatch_lag_s": sent.dispatch_lag_s,
        "ttft_s": out.ttft,
        "e2e_s": out.e2e,
        "itl_s": itl_summary(out.itls),
        "tpot_s": out.tpot,
        "prompt_tokens": out.prompt_tokens if server_prompt else sent.expected_prompt_tokens,
        "prompt_tokens_source": "server" if server_prompt else "synthesized",
        "cached_tokens": out.cached_tokens,
        "expected_prompt_tokens": sent.expected_prompt_tokens,
        "output_tokens": out.output_tokens,
        "expected_output_tokens": sent.expected_output_tokens,
        "theoretical_hit_blocks": hit_blocks,
        "total_blocks": sent.total_blocks,
        "accepted": out.accepted,
        "retries": out.retries,
        "status": "ok" if out.ok else "error",
        "error": None if out.ok else _error(out),
    }
    if out.engine is not None:  # only a server that states its own timeline (the simulated engine)
        record["engine"] = out.engine
    return record


def _error(out: Outcome) -> RequestError:
    error: RequestError = {"class": out.error_class or "unknown", "message": out.error_message}
    if out.error_class == "bad_usage" and out.usage is not None:
        error["usage"] = out.usage  # the figures as the server reported them
    return error
