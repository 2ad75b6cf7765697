"""The replayer on a real engine's terms: token ids from the model's vocabulary, the stale keep-alive
retry, and a theoretical hit rate that follows what the server accepted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kv_cache_tester.replay.client import send
from kv_cache_tester.replay.http import Endpoint
from kv_cache_tester.replay.prompts import DeliveredBlocks, ids_for_vocab

SSE_BODY = (
    b'data: {"choices":[{"index":0,"text":"hi"}]}\n\n'
    b'data: {"choices":[{"index":0,"text":" there"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


@dataclass
class KeepAliveServer:
    """A real HTTP/1.1 server on loopback that keeps connections alive for ``idle_s`` seconds.

    A request that comes in on a connection idle for longer finds it closed: the server drops the
    connection without answering or counting it (the race in which a client reuses a keep-alive
    connection at the moment the server closes it). ``drop_all``: every request is read, counted,
    and its connection dropped without an answer (a request that reached the server).
    """

    idle_s: float
    drop_all: bool = False
    served: list[str] = field(default_factory=list)  # X-Request-ID of every request the server took
    stale_drops: int = 0
    port: int = 0

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        last: float | None = None  # end of the previous response on this connection
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                if last is not None and loop.time() - last > self.idle_s:
                    self.stale_drops += 1
                    break
                self.served.append(headers.get("x-request-id", ""))
                if self.drop_all:
                    break
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n" % len(SSE_BODY) + SSE_BODY
                )
                await writer.drain()
                last = loop.time()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.contextmanager
def keepalive_server(idle_s: float, drop_all: bool = False) -> Iterator[KeepAliveServer]:
    srv = KeepAliveServer(idle_s, drop_all)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def main() -> asyncio.base_events.Server:
        server = await asyncio.start_server(srv._conn, "127.0.0.1", 0)
        srv.port = server.sockets[0].getsockname()[1]
        return server

    server = loop.run_until_complete(main())
    thread = threading.Thread(target=lambda: (started.set(), loop.run_forever()), daemon=True)
    thread.start()
    started.wait()
    try:
        yield srv
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


@dataclass
class _Url:
    url: str


async def _two_sends(port: int, gap: float, with_retry: bool = True) -> list:
    endpoint = Endpoint(f"http://127.0.0.1:{port}/v1/completions")
    outs = []
    for i in range(2):
        if i:
            await asyncio.sleep(gap)
        outs.append(await send(endpoint, b"{}", {"X-Request-ID": f"r{i}"}, 10, retry_stale=with_retry))
    endpoint.close()
    return outs


@pytest.mark.integration
def test_a_request_on_a_stale_keepalive_connection_is_sent_once_more_on_a_fresh_one():
    with keepalive_server(idle_s=0.05) as srv:
        first, second = asyncio.run(_two_sends(srv.port, gap=0.3))
    assert first.ok and first.retries == 0
    assert second.ok and second.retries == 1, (second.error_class, second.error_message)
    assert srv.stale_drops == 1 and srv.served == ["r0", "r1"]  # taken exactly once each


@pytest.mark.integration
def test_without_the_retry_the_stale_connection_is_a_failure():
    # the guard of the test above: the same race, without the retry, fails the request
    with keepalive_server(idle_s=0.05) as srv:
        _, second = asyncio.run(_two_sends(srv.port, gap=0.3, with_retry=False))
    assert not second.ok and second.error_class == "connect" and second.retries == 0
    assert srv.served == ["r0"]


@pytest.mark.integration
def test_a_request_that_reached_the_server_is_never_sent_twice():
    # the server reads every request and drops its connection unanswered: no retry, on a new
    # connection (first request) or on a reused one (there is none: each drop closes it)
    with keepalive_server(idle_s=10.0, drop_all=True) as srv:
        first, second = asyncio.run(_two_sends(srv.port, gap=0.05))
    for out in (first, second):
        assert not out.ok and out.retries == 0 and not out.accepted
    assert srv.served == ["r0", "r1"]


@pytest.mark.integration
def test_the_replayer_retries_a_stale_connection_and_records_it_once(tmp_path, kit):
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("s", 3, think=1.0)])
    out = tmp_path / "out"
    with keepalive_server(idle_s=0.1) as srv:
        server = _Url(f"http://127.0.0.1:{srv.port}")
        res = kit.run_replay(
            server, traces, out, "--max-users", "1", "--api", "chat", "--time-scale", "0.3", "--model", "m"
        )
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert [r["status"] for r in recs] == ["ok"] * 3
    # turn 1 reuses turn 0's connection after the server's idle limit; turn 2 finds the pool empty
    # (the retry's connection is not kept) and opens a new one
    assert [r["retries"] for r in recs] == [0, 1, 0]
    assert srv.stale_drops == 1 and len(srv.served) == 3  # each request taken by the server once


# --- token ids from the model's vocabulary ------------------------------------------------------


def test_ids_for_vocab_stay_inside_the_vocabulary():
    assert ids_for_vocab(4096) == range(1000, 4096 - 256)
    assert ids_for_vocab(128256) == range(1000, 1000 + 16384)
    small = ids_for_vocab(1024)
    assert small.start == 256 and small.stop == 1024 - 64
    with pytest.raises(Exception, match="pass --tokenizer"):
        ids_for_vocab(300)


def _prompt_ids(server) -> list[int]:
    return [int(w) for s in server.requests() for w in s["prompt"].split()]


@pytest.mark.integration
def test_completions_ids_come_from_the_vocabulary_the_server_gives(tmp_path, stream_server, kit):
    server = stream_server("--keep-prompts", "--vocab-size", "4096")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("c", 3)])
    res = kit.run_replay(server, traces, tmp_path / "out", "--max-users", "1", "--api", "completions")
    assert res.returncode == 0, res.stderr
    ids = _prompt_ids(server)
    assert ids and max(ids) < 4096 - 256 and min(ids) >= 1000
    assert "vocabulary of 4096 ids" in res.stderr


@pytest.mark.integration
def test_completions_without_a_vocabulary_or_tokenizer_is_refused(tmp_path, stream_server, kit):
    server = stream_server("--vocab-size", "0")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("c", 2)])
    res = kit.run_replay(server, traces, tmp_path / "out", "--max-users", "1", "--api", "completions")
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "vocabulary size" in last and "--tokenizer" in last and "Traceback" not in res.stderr
    assert server.requests() == []


def _tokenizer(folder: Path) -> tuple[Path, int]:
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u")]
    words = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(900)})
    lines = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(lines, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json", tok.get_vocab_size()


@pytest.mark.integration
def test_completions_with_a_tokenizer_sends_its_ids_block_exact(tmp_path, stream_server, kit):
    pytest.importorskip("tokenizers")
    path, size = _tokenizer(tmp_path / "tok")
    server = stream_server("--keep-prompts", "--vocab-size", "0")  # the tokenizer alone decides
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("c", 3)])
    out = tmp_path / "out"
    res = kit.run_replay(
        server, traces, out, "--max-users", "1", "--api", "completions", "--tokenizer", str(path)
    )
    assert res.returncode == 0, res.stderr
    prompts = [[int(w) for w in s["prompt"].split()] for s in server.requests()]
    assert [len(p) for p in prompts] == [128, 192, 256]  # exactly `in` tokens
    assert all(0 <= i < size for p in prompts for i in p)
    assert prompts[1][:128] == prompts[0] and prompts[2][:192] == prompts[1]  # block-exact prefixes


# --- the theoretical hit rate follows what the server accepted -----------------------------------


@pytest.mark.integration
def test_theoretical_hits_leave_out_the_blocks_of_a_failed_request(tmp_path, stream_server, kit):
    server = stream_server("--fail-turns", "1")  # the second turn of every trace gets a 500
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("f", 3)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert [r["status"] for r in recs] == ["ok", "error", "ok"]
    assert [r["accepted"] for r in recs] == [True, False, True]
    # turn 2 (blocks 1-4) finds only turn 0's blocks 1-2: the failed turn 1 never cached block 3
    assert [r["theoretical_hit_blocks"] for r in recs] == [0, 2, 2]
    summ = kit.summary(out)
    assert summ["cache"]["theoretical_hit_rate"] == pytest.approx(2 / (2 + 4))  # accepted requests only
    assert json.loads((out / "summary.json").read_text())["counts"]["failed"] == 1


def test_a_request_finds_the_blocks_of_accepted_requests_sent_before_it():
    ref = DeliveredBlocks()
    a, b, c = ref.ticket(), ref.ticket(), ref.ticket()  # three siblings sent in this order
    ref.add([1, 2, 3], "s", b)  # b accepted (a not yet; c never: it failed)
    assert ref.hits([1, 2, 3, 9], "s", c) == 3  # sent after b: finds b's blocks
    assert ref.hits([1, 2, 3], "s", a) == 0  # sent before b: does not
    assert ref.hits([1, 2, 3], "s", b) == 0  # never its own blocks
    ref.add([1, 2], "s", a)  # a accepted late: its earlier ticket now holds blocks 1-2
    assert ref.hits([1, 2, 3], "s", b) == 2
    assert ref.hits([1, 2, 3], "other", c) == 0  # scopes stay apart
    ref.forget("s")
    assert ref.hits([1], "s", c) == 0


class NaiveBlocks:
    """DeliveredBlocks' definition, block by block (the reference its faster passes must match)."""

    def __init__(self) -> None:
        self.first: dict[str, dict[int, int]] = {}

    def add(self, hash_ids: list[int], scope: str, ticket: int) -> None:
        first = self.first.setdefault(scope, {})
        for hid in hash_ids:
            if first.get(hid, ticket + 1) > ticket:
                first[hid] = ticket

    def hits(self, hash_ids: list[int], scope: str, ticket: int) -> int:
        first = self.first.get(scope, {})
        n = 0
        for hid in hash_ids:
            if first.get(hid, ticket) >= ticket:
                break
            n += 1
        return n


def test_the_reference_counts_what_its_definition_says_in_any_order():
    import random

    rng = random.Random(7)
    for _ in range(200):
        ref, naive = DeliveredBlocks(), NaiveBlocks()
        owners = [[rng.randrange(1, 6)] for _ in range(3)]  # a parent and two sub-agents, sharing ids
        sent: list[tuple[list[int], str, int]] = []
        for _ in range(40):
            op = rng.random()
            if op < 0.45:  # an owner's next request: its previous blocks and some new ones
                ids = owners[rng.randrange(3)]
                ids.extend(rng.randrange(1, 40) for _ in range(rng.randrange(0, 4)))
                scope = rng.choice(["s", "s", "t"])
                sent.append((list(ids), scope, ref.ticket()))
            elif op < 0.8 and sent:  # one of them accepted, in any order (late ones too)
                ids, scope, ticket = sent[rng.randrange(len(sent))]
                ref.add(ids, scope, ticket)
                naive.add(ids, scope, ticket)
            elif op < 0.97 and sent:
                ids, scope, ticket = sent[rng.randrange(len(sent))]
                assert ref.hits(ids, scope, ticket) == naive.hits(ids, scope, ticket)
            else:
                scope = rng.choice(["s", "t"])
                ref.forget(scope)
                naive.first.pop(scope, None)
        for ids, scope, ticket in sent:
            assert ref.hits(ids, scope, ticket) == naive.hits(ids, scope, ticket)
