"""Disaggregated serving: an instance plays the prefill or the decode role, as routers drive them.

Two protocols, told apart by the request's fields (either role, either metrics dialect):

- vLLM (NIXL-style, sequential; ``vllm-router --vllm-pd-disaggregation``): the router first sends the
  prefill the request with ``max_tokens: 1`` and ``kv_transfer_params.do_remote_decode``; the prefill
  answers with ``kv_transfer_params`` naming where its blocks are (``remote_host``/``remote_port``: this
  server's own address, ``remote_request_id``: the handoff); the router passes those to the decode,
  which contacts the prefill there, models the transfer, then decodes.
- SGLang (bootstrap rendezvous, concurrent; ``smg --pd-disaggregation``): the router sends the same
  request to both at once with ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``; the prefill
  listens on its bootstrap port (``--disaggregation-bootstrap-port``) and marks the room ready once the
  prompt is computed; the decode waits there for the room (bounded), then transfers and decodes.

Handoff over HTTP (the prefill serves it on its API port and on its bootstrap port):
``GET /engine_sim/kv_transfer/{key}?wait_s=S`` waits up to S (wall) seconds for the prompt to be
ready and answers its size; ``DELETE`` the same path once the decode holds the blocks. Until then the
prefill keeps the prompt's blocks pinned (out of eviction), and frees them after ``--kv-transfer-timeout``
simulated seconds if no decode took them (vLLM's abort timeout, SGLang's waiting timeout).

Transfer model (decode side, simulated time): the decode reuses its own GPU prefix-cache hits and
receives the rest, taking ``missing tokens x KV bytes per token / (kv_transfer_gbs x TP) +
kv_transfer_latency_ms``; the scheduler holds the request meanwhile. ``KVTransfer`` is this module's
part inside the engine (the engine's ``transfer``): a decode's admission, a prefill's pinned blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from agentsweep.engine_sim.kv_cache import Lookup
from agentsweep.engine_sim.request import LOADING, SimRequest
from agentsweep.engine_sim.scheduler import Engine
from agentsweep.errors import InputError

MODES = ("null", "prefill", "decode")
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's default
DEFAULT_KV_TRANSFER_GBS = 450.0
# Fixed cost per handoff: the decode's request to the prefill, the transfer's post and its completion
# notice, and the decode noticing it at its next scheduler step: a few milliseconds on real
# deployments (vLLM's nixl_post_time plus one decode step), whatever the size.
DEFAULT_KV_TRANSFER_LATENCY_MS = 5.0
# Simulated seconds a prefill keeps blocks for a decode that has not taken them, and the longest a
# decode waits for its prefill's room (SGLang's disaggregation waiting timeout is 300 s).
DEFAULT_KV_TRANSFER_TIMEOUT_S = 300.0
ROUTE = "/engine_sim/kv_transfer/{key}"
ROOM_PREFIX = "room-"


class ProtocolError(Exception):
    """A request this role cannot serve (400), or a handoff that failed (502/504)."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(slots=True)
class DisaggConfig:
    mode: str = "null"
    host: str = "127.0.0.1"
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    kv_transfer_gbs: float = DEFAULT_KV_TRANSFER_GBS
    kv_transfer_latency_ms: float = DEFAULT_KV_TRANSFER_LATENCY_MS
    kv_transfer_timeout_s: float = DEFAULT_KV_TRANSFER_TIMEOUT_S  # simulated seconds


@dataclass(slots=True)
class Plan:
    """How one request is served: ``role`` 'plain', 'prefill' or 'decode', over ``protocol``."""

    role: str = "plain"
    protocol: str = ""  # 'vllm' | 'sglang'
    key: str = ""  # the handoff: 'vllm-<request id>' or 'room-<bootstrap_room>'
    peer: str = ""  # decode: base URL of the prefill's handoff server
    settled: bool = False  # prefill: published (or failed); decode: released


@dataclass(slots=True, eq=False)
class Handoff:
    """A prefill's prompt waiting for its decode (or a decode waiting for the prefill's room)."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    req: SimRequest | None = None
    failed: str = ""
    waiters: int = 0
    timer: asyncio.TimerHandle | None = None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class KVTransfer:
    """A role's part inside the engine: a decode's prompt arrives over the fabric, a prefill's blocks
    stay pinned for its decode. ``bandwidth`` in bytes/s for all ranks together, ``latency`` in
    simulated seconds per handoff."""

    def __init__(self, engine: Engine, bandwidth: float, latency: float) -> None:
        self.engine = engine
        self.bandwidth = bandwidth
        self.latency = latency
        self.pinned_blocks = 0  # blocks finished prefills hold for their decodes

    def admit(self, r: SimRequest, hit: Lookup) -> int:
        """A decode's prompt: its local GPU prefix hits are used, the rest arrives over the fabric.

        The request takes blocks for the whole prompt now (as a decode preallocates them) and waits
        ``bytes / bandwidth + latency`` of simulated time while others keep stepping. Then only the
        last prompt token is computed (for its logits, as vLLM does), so every prompt token is
        reported cached: local hits plus transferred tokens. The CPU tier is not consulted.
        Returns the first chunk size (0), or -1 when the blocks do not fit now.
        """
        engine = self.engine
        kv = engine.kv
        bs = engine.block_size
        g = hit.gpu_blocks
        hit = Lookup(g, 0, hit.reclaim, hit.path)
        need = engine.blocks_for(r.tokens_len) - g
        if need > kv.available - hit.reclaim:
            return -1
        r.node = kv.acquire(hit)
        kv.allocate(need)
        r.depth = r.registered = g
        r.held = g + need
        r.computed = r.tokens_len - 1
        local = g * bs
        moved = r.tokens_len - local
        r.remote_tokens = moved
        st = engine.stats
        if kv.prefix_caching:
            st.prefix_queries += r.prefill_len
            st.prefix_hits += local
        st.external_queries += moved
        st.external_hits += moved
        nbytes = moved * kv.block_bytes // bs
        seconds = nbytes / self.bandwidth + self.latency
        st.kv_transfers += 1
        st.kv_transfer_tokens += moved
        st.kv_transfer_bytes += nbytes
        st.kv_transfer_time.observe(seconds)
        st.kv_transfer_size.observe(nbytes)
        st.kv_transfer_last_gbs = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        r.cached_tokens = r.tokens_len
        r.gpu_hit_tokens = local
        r.transfer_s = seconds
        r.status = LOADING
        r.ready_at = engine.t + seconds
        engine.loading.append(r)
        return 0

    def hold(self, r: SimRequest) -> None:
        """A finished prefill keeps its blocks until its decode takes them (``release``)."""
        r.pinned = True
        self.pinned_blocks += r.held

    def release(self, r: SimRequest) -> None:
        """A finished prefill's blocks were taken (or the wait for them expired): let them go."""
        if r.pinned:
            r.pinned = False
            self.pinned_blocks -= r.held
            self.engine.free_blocks(r)
            self.engine.wake()


class Disagg:
    """The role of one engine instance and the handoffs it holds or makes."""

    def __init__(self, config: DisaggConfig, engine: Engine, speed: float = 1.0, tp: int = 1) -> None:
        self.config = config
        self.tp = tp
        self.engine = engine
        self.mode = config.mode
        self.wait_wall_s = config.kv_transfer_timeout_s / speed
        self.engine_id = uuid.uuid4().hex
        self.handoffs: dict[str, Handoff] = {}
        self.bootstrap_port: int | None = None  # bound port once started (prefill)
        self.bootstrap_host: str = config.host  # the address the listener bound, once started
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        engine.stats.kv_role = self.mode
        self.transfer = KVTransfer(
            engine, config.kv_transfer_gbs * 1e9 * tp, config.kv_transfer_latency_ms / 1e3
        )
        if self.mode != "null":
            engine.transfer = self.transfer

    # -- lifecycle -----------------------------------------------------------------------------
    def add_routes(self, router: web.UrlDispatcher) -> None:
        if self.mode == "prefill":
            router.add_get(ROUTE, self._take)
            router.add_delete(ROUTE, self._release)

    async def start(self) -> None:
        if self.mode == "prefill":
            app = web.Application()
            self.add_routes(app.router)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.config.host, self.config.bootstrap_port, reuse_address=True)
            try:
                await site.start()
            except OSError as err:
                await runner.cleanup()
                raise InputError(
                    f"engine-sim --disaggregation-bootstrap-port: cannot listen on "
                    f"{self.config.host}:{self.config.bootstrap_port}: {err.strerror or err}"
                ) from None
            self._runner = runner
            self.bootstrap_host, self.bootstrap_port = runner.addresses[0][:2]
        elif self.mode == "decode":
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.wait_wall_s + 30))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for h in self.handoffs.values():
            if h.timer is not None:
                h.timer.cancel()

    # -- requests ------------------------------------------------------------------------------
    def plan(self, body: dict[str, Any], request_id: str | None) -> Plan:
        """Which protocol a request speaks and whether this role serves it (ProtocolError if not)."""
        params = body.get("kv_transfer_params")
        room = body.get("bootstrap_room")
        if params is not None and not isinstance(params, dict):
            raise ProtocolError("'kv_transfer_params' must be an object")
        wants_prefill = bool(params and params.get("do_remote_decode"))
        wants_decode = bool(params and params.get("do_remote_prefill"))
        if not (wants_prefill or wants_decode or room is not None):
            return Plan()
        asked = "prefill" if wants_prefill else "decode" if wants_decode else ""
        if self.mode == "null":
            what = f"a disaggregated {asked}" if asked else "a disaggregated prefill/decode handoff"
            raise ProtocolError(
                f"the request asks for {what} (kv_transfer_params / bootstrap_room) but this engine "
                "runs without --disaggregation-mode"
            )
        if asked and asked != self.mode:
            field_ = "do_remote_decode" if wants_prefill else "do_remote_prefill"
            raise ProtocolError(
                f"the request asks for a {asked} (kv_transfer_params.{field_}) but this engine is a "
                f"{self.mode} instance (--disaggregation-mode {self.mode})"
            )
        if asked:
            return self._plan_vllm(params or {}, request_id)
        return self._plan_sglang(body, room)

    def _plan_vllm(self, params: dict[str, Any], request_id: str | None) -> Plan:
        if self.mode == "prefill":
            key = f"vllm-{request_id}" if request_id else f"vllm-{uuid.uuid4().hex}"
            if key in self.handoffs:
                key = f"vllm-{uuid.uuid4().hex}"
            return Plan("prefill", "vllm", key)
        peer = _peer_url(
            params.get("remote_host"),
            params.get("remote_port"),
            "kv_transfer_params needs remote_host (a host name) and remote_port (a port) of the "
            "prefill instance, got remote_host={host!r} remote_port={port!r}",
        )
        handoff = params.get("remote_request_id") or (f"vllm-{request_id}" if request_id else None)
        if not isinstance(handoff, str):
            raise ProtocolError(
                "kv_transfer_params.remote_request_id (or an X-Request-ID header) is required"
            )
        return Plan("decode", "vllm", handoff, peer)

    def _plan_sglang(self, body: dict[str, Any], room: Any) -> Plan:
        if not _int(room) or room < 0:
            raise ProtocolError(f"'bootstrap_room' must be a non-negative integer, got {room!r}")
        key = f"{ROOM_PREFIX}{room}"
        if self.mode == "prefill":
            return Plan("prefill", "sglang", key)
        peer = _peer_url(
            body.get("bootstrap_host"),
            body.get("bootstrap_port"),
            "a decode request with bootstrap_room needs bootstrap_host (the prefill's host) and "
            "bootstrap_port (its bootstrap port), got bootstrap_host={host!r} bootstrap_port={port!r}",
        )
        return Plan("decode", "sglang", key, peer)

    # -- prefill side --------------------------------------------------------------------------
    def publish(self, plan: Plan, req: SimRequest) -> None:
        """The prompt is computed and its blocks pinned: mark the handoff ready for the decode."""
        plan.settled = True
        h = self.handoffs.get(plan.key)
        if h is None or h.req is not None or h.failed:
            h = self.handoffs[plan.key] = Handoff()
        h.req = req
        h.ready.set()
        h.timer = asyncio.get_running_loop().call_later(self.wait_wall_s, self._expire, plan.key, h)

    def fail(self, plan: Plan, why: str) -> None:
        """The prefill did not complete: a decode waiting for this handoff gets an error, not a hang."""
        plan.settled = True
        if plan.protocol != "sglang":
            return  # the vLLM router sees the prefill's error itself and never calls the decode
        h = self.handoffs.get(plan.key)
        if h is None or h.req is not None:
            h = self.handoffs[plan.key] = Handoff()
        h.failed = why
        h.ready.set()
        h.timer = asyncio.get_running_loop().call_later(self.wait_wall_s, self._forget, plan.key, h)

    def settle(self, plan: Plan, req: SimRequest) -> None:
        """After the prefill's response: publish it if not done yet, or fail its handoff."""
        if plan.settled:
            return
        if req.pinned:
            self.publish(plan, req)
        else:
            self.fail(plan, f"the prefill request ended without computing the prompt ({req.finish_reason})")

    def transfer_params(self, plan: Plan, req: SimRequest, sockname: tuple[str, int]) -> dict[str, Any]:
        """vLLM: what the prefill answers for the router to hand the decode."""
        blocks = self.engine.blocks_for(req.tokens_len)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(blocks)),
            "remote_host": sockname[0],
            "remote_port": sockname[1],
            "remote_request_id": plan.key,
            "tp_size": self.tp,
        }

    def _forget(self, key: str, h: Handoff) -> None:
        if self.handoffs.get(key) is h:
            del self.handoffs[key]

    def _expire(self, key: str, h: Handoff) -> None:
        """No decode took the blocks in time: free them (vLLM's abort timeout)."""
        self._forget(key, h)
        if h.req is not None and h.req.pinned:
            self.transfer.release(h.req)
            self.engine.stats.kv_transfer_expired += 1

    async def _take(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        try:
            wait = float(request.query.get("wait_s", "0"))
        except ValueError:
            wait = -1.0
        if not (math.isfinite(wait) and wait >= 0):
            return _error(f"wait_s must be a non-negative number, got {request.query.get('wait_s')!r}", 400)
        h = self.handoffs.get(key)
        if h is None:
            if not key.startswith(ROOM_PREFIX):
                return _error(f"no prefilled prompt {key} here (never prefilled, or expired)", 404)
            h = self.handoffs[key] = Handoff()  # the decode came first: wait for the prefill
        if not h.ready.is_set():
            h.waiters += 1
            try:
                await asyncio.wait_for(h.ready.wait(), min(wait, self.wait_wall_s))
            except TimeoutError:
                pass
            finally:
                h.waiters -= 1
        if not h.ready.is_set():
            if not h.waiters and h.req is None:
                self._forget(key, h)
            return _error(f"{key} not ready after {wait:g} s", 503)
        if h.failed or h.req is None:
            return _error(f"{key}: {h.failed}", 410)
        first = h.req.first_token_at
        return web.json_response(
            {
                "engine_id": self.engine_id,
                "prompt_tokens": h.req.tokens_len,
                "block_size": self.engine.block_size,
                "blocks": h.req.held,
                # the prefill's own time for the prompt (simulated s): part of the request's TTFT
                "prefill_s": first - h.req.arrival if first is not None else 0.0,
            }
        )

    async def _release(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        h = self.handoffs.pop(key, None)
        if h is None:
            return _error(f"no prefilled prompt {key} here (never prefilled, or expired)", 404)
        if h.timer is not None:
            h.timer.cancel()
        if h.req is not None:
            self.transfer.release(h.req)
        return web.json_response({"released": key})

    # -- decode side ---------------------------------------------------------------------------
    async def fetch(self, plan: Plan, prompt_tokens: int) -> float:
        """Contact the prefill for this handoff (waiting, bounded, for its room); ProtocolError if not.

        Returns the simulated seconds the prefill took for the prompt (its arrival to its first token).
        """
        assert self._session is not None
        where = "prefill" if plan.protocol == "vllm" else "bootstrap server"
        url = f"{plan.peer}{ROUTE.format(key=plan.key)}"
        wait = 0.0 if plan.protocol == "vllm" else self.wait_wall_s
        try:
            async with self._session.get(url, params={"wait_s": f"{wait:g}"}) as resp:
                text = await resp.text()
                status = resp.status
                info = await resp.json(content_type=None) if status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            self.engine.stats.kv_transfer_failed += 1
            raise ProtocolError(
                f"KV transfer failed: the {where} at {plan.peer} cannot be reached for {plan.key} "
                f"({type(err).__name__}: {err or 'no answer'})",
                502,
                "KVTransferError",
            ) from None
        if status != 200:
            self.engine.stats.kv_transfer_failed += 1
            if status == 503:
                raise ProtocolError(
                    f"KV transfer failed: {plan.key} did not become ready at the {where} {plan.peer} within "
                    f"{self.config.kv_transfer_timeout_s:g} simulated s (--kv-transfer-timeout)",
                    504,
                    "KVTransferTimeout",
                )
            raise ProtocolError(
                f"KV transfer failed: the {where} at {plan.peer} answered {status}: {_message(text)}",
                502,
                "KVTransferError",
            )
        if not isinstance(info, dict) or info.get("prompt_tokens") != prompt_tokens:
            self.release(plan)
            self.engine.stats.kv_transfer_failed += 1
            got = info.get("prompt_tokens") if isinstance(info, dict) else info
            raise ProtocolError(
                f"KV transfer failed: the prefill at {plan.peer} computed {got} prompt tokens for "
                f"{plan.key}, this request's prompt has {prompt_tokens}",
                502,
                "KVTransferError",
            )
        prefill_s = info.get("prefill_s", 0.0)
        return float(prefill_s) if isinstance(prefill_s, (int, float)) and math.isfinite(prefill_s) else 0.0

    def release(self, plan: Plan) -> None:
        """The decode holds the blocks now: tell the prefill to let go of them (in the background)."""
        if plan.settled or plan.role != "decode":
            return
        plan.settled = True
        task = asyncio.get_running_loop().create_task(self._delete(plan))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete(self, plan: Plan) -> None:
        assert self._session is not None
        # Not reached: the prefill frees them after its timeout.
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._session.delete(f"{plan.peer}{ROUTE.format(key=plan.key)}") as resp:
                await resp.read()

    # -- description ---------------------------------------------------------------------------
    def describe(self, kv_bytes_per_token: int, tp: int) -> str:
        c = self.config
        if self.mode == "prefill":
            return (
                f"[engine_sim] disaggregation: prefill role; bootstrap listener on {self.bootstrap_host}:"
                f"{self.bootstrap_port}; prompts held for their decode up to {c.kv_transfer_timeout_s:g} "
                "simulated s"
            )
        return (
            f"[engine_sim] disaggregation: decode role; modelled KV transfer {c.kv_transfer_gbs:g} GB/s per "
            f"GPU x TP {tp} = {c.kv_transfer_gbs * tp:g} GB/s + {c.kv_transfer_latency_ms:g} ms per handoff, "
            f"{kv_bytes_per_token:,} KV bytes per token"
        )


def _peer_url(host: Any, port: Any, problem: str) -> str:
    """The prefill's base URL from a request's host and port fields; ``problem`` (formatted with the
    values) is the 400 when they are not a host name and a port."""
    if not isinstance(host, str) or not host or not _int(port) or not 0 < port < 65536:
        raise ProtocolError(problem.format(host=host, port=port))
    return _base_url(host, port)


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def _message(text: str) -> str:
    with contextlib.suppress(ValueError, LookupError, TypeError):
        return str(json.loads(text)["error"]["message"])
    return text[:200]
