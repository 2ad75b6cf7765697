"""The real routers in their prefill/decode modes driving one simulated prefill and one decode on loopback.

vllm-router (``--vllm-pd-disaggregation``) speaks the kv_transfer_params protocol to vLLM-dialect sims;
smg (``--pd-disaggregation``) the bootstrap-room protocol to SGLang-dialect sims.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from agentsweep.cell.placement import free_port
from agentsweep.metrics.dialects import map_text

from tests.support import served_url, wait_for_http

pytestmark = pytest.mark.slow

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
REPO = Path(__file__).resolve().parents[2]
ROUTERS = ("vllm-router", "smg")
PROMPT = "the quick brown fox jumps over the lazy dog " * 30


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass
class Pd:
    router: str
    dialect: str
    url: str
    prefill: str
    decode: str
    router_log: Path

    def metrics(self, which: str) -> dict[str, float | None]:
        with urllib.request.urlopen(getattr(self, which) + "/metrics", timeout=5) as resp:
            return map_text(resp.read().decode(), self.dialect)[1]


@pytest.fixture(scope="module", params=ROUTERS)
def pd(request, tmp_path_factory) -> Iterator[Pd]:
    router = request.param
    dialect = "vllm" if router == "vllm-router" else "sglang"
    logs = tmp_path_factory.mktemp(router)
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    sim = [
        sys.executable,
        "-m",
        "agentsweep.cli",
        "engine-sim",
        MODEL,
        "--speed",
        "50",
        "--quantization",
        "fp8",
    ]
    sim += ["--dialect", dialect]
    boot, port = free_port(), free_port()
    try:  # the engines bind port 0 and say their URL: no other test's server can hold their ports
        pre = start([*sim, "--port", "0", "--disaggregation-mode", "prefill",
                     "--disaggregation-bootstrap-port", str(boot)], "prefill")  # fmt: skip
        dec = start([*sim, "--port", "0", "--disaggregation-mode", "decode"], "decode")
        p_url, d_url = served_url(logs / "prefill.log", pre), served_url(logs / "decode.log", dec)
        wait_for_http(p_url + "/health", timeout=60, interval=0.2, process=pre)
        wait_for_http(d_url + "/health", timeout=60, interval=0.2, process=dec)
        common = ["--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                  "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                  "--worker-startup-check-interval", "1"]  # fmt: skip
        if router == "vllm-router":
            argv = [sys.executable, "-m", "vllm_router.launch_router", *common, "--log-level", "warning",
                    "--vllm-pd-disaggregation", "--prefill", p_url, "--decode", d_url]  # fmt: skip
            ready = "/health"
        else:
            argv = [sys.executable, "-m", "smg", "launch", *common, "--log-level", "warn",
                    "--pd-disaggregation", "--prefill", p_url, str(boot), "--decode", d_url]  # fmt: skip
            ready = "/readiness"
        proc = start(argv, router)
        url = f"http://127.0.0.1:{port}"
        wait_for_http(url + ready, timeout=90, interval=0.2, process=proc)
        yield Pd(router, dialect, url, p_url, d_url, logs / f"{router}.log")
    finally:
        for proc in reversed(procs):
            stop(proc)


def post(url: str, body: dict) -> tuple[dict | None, list[dict]]:
    """The JSON answer (non-streaming) or the decoded SSE chunks (streaming)."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        raw = resp.read().decode()
    if not body.get("stream"):
        return json.loads(raw), []
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e.strip()]
    assert events[-1] == "[DONE]", events[-3:]
    return None, [json.loads(e) for e in events[:-1]]


def text_of(chunks: list[dict]) -> str:
    return "".join(
        ch.get("text") or ch.get("delta", {}).get("content") or "" for c in chunks for ch in c["choices"]
    )


def expected_cached(pd: Pd, before: dict[str, dict], usage: dict) -> int:
    """What the client is told: the decode's count through smg; vllm-router overwrites the decode's
    usage with the prefill's cached tokens (its PD usage reconciliation)."""
    if pd.router == "smg":
        return usage["prompt_tokens"]
    after = pd.metrics("prefill")
    return int(after["prefix_cache_hits_total"] - before["prefill"]["prefix_cache_hits_total"])


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_router_drives_prefill_and_decode(pd, chat, stream):
    body: dict = {"model": MODEL, "max_tokens": 6, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": f"{PROMPT} chat={chat} stream={stream}"}]
    else:
        body["prompt"] = f"{PROMPT} chat={chat} stream={stream}"
    before = {w: pd.metrics(w) for w in ("prefill", "decode")}
    whole, chunks = post(pd.url + ("/v1/chat/completions" if chat else "/v1/completions"), body)
    if stream:
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == []
        assert len(text_of(chunks).split()) == 6
    else:
        usage = whole["usage"]
        choice = whole["choices"][0]
        assert len((choice["message"]["content"] if chat else choice["text"]).split()) == 6
    assert usage["completion_tokens"] == 6
    d = pd.metrics("decode")
    p = pd.metrics("prefill")
    n = usage["prompt_tokens"]
    assert d["prompt_tokens_total"] - before["decode"]["prompt_tokens_total"] == n
    assert p["prompt_tokens_total"] - before["prefill"]["prompt_tokens_total"] == n
    assert d["requests_finished_total"] - before["decode"]["requests_finished_total"] == 1
    # the decode received every prompt token it did not hold: hits + transferred = the whole prompt
    hits = (d["prefix_cache_hits_total"] + d["cpu_cache_hits_total"]) - (
        before["decode"]["prefix_cache_hits_total"] + before["decode"]["cpu_cache_hits_total"]
    )
    assert hits == n
    assert usage["prompt_tokens_details"]["cached_tokens"] == expected_cached(pd, before, usage)


def test_second_turn_hits_the_prefill_prefix_cache(pd):
    body = {"model": MODEL, "prompt": PROMPT + " second turn test", "max_tokens": 3}
    post(pd.url + "/v1/completions", body)
    before = pd.metrics("prefill")
    whole, _ = post(pd.url + "/v1/completions", {**body, "prompt": body["prompt"] + " and a follow-up"})
    hits = pd.metrics("prefill")["prefix_cache_hits_total"] - before["prefix_cache_hits_total"]
    assert hits >= (whole["usage"]["prompt_tokens"] // 16 - 2) * 16  # all but the new tail's blocks
    assert hits > 0


def test_router_log_has_no_bootstrap_complaint(pd):
    post(pd.url + "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 2})
    text = pd.router_log.read_text(errors="replace")
    assert "Bootstrap port did not accept" not in text
    assert "ERROR" not in text
    # smg admits requests to an SGLang decode within its running window (from /server_info).
    assert "PD admission is off" not in text


def test_replayer_through_the_router_cross_checks(pd, tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("trace_0504.json", "trace_0021.json"):
        shutil.copy(REPO / "kv-cache-tester" / "sample_traces" / name, traces / name)
    before = {w: pd.metrics(w) for w in ("prefill", "decode")}
    out = tmp_path / "out"
    cmd = [
        sys.executable, str(REPO / "kv-cache-tester" / "trace_replay_tester.py"),
        "--api-endpoint", pd.url, "--trace-directory", str(traces), "--output-dir", str(out),
        "--max-users", "2", "--time-scale", "0.001", "--max-context", "20000", "--test-duration", "8",
        "--no-color", "--no-plot",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    ok = [r for r in recs if r["status"] == "ok"]
    assert len(ok) >= 4 and len(ok) == len(recs), [r["status"] for r in recs]
    d, p = pd.metrics("decode"), pd.metrics("prefill")

    def delta(row: dict, base: dict, col: str) -> float:
        return row[col] - base[col]

    assert delta(d, before["decode"], "requests_finished_total") == len(ok)
    assert delta(d, before["decode"], "prompt_tokens_total") == sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    decode_hits = delta(d, before["decode"], "prefix_cache_hits_total") + delta(
        d, before["decode"], "cpu_cache_hits_total"
    )
    if pd.router == "smg":
        assert decode_hits == cached  # the validity check's figures, exact on the decode
    else:
        # vllm-router reports the prefill's cached tokens: those are the prefill's GPU prefix hits
        assert delta(p, before["prefill"], "prefix_cache_hits_total") == cached
        assert decode_hits == sum(r["prompt_tokens"] for r in ok)
