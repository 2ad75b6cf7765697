"""The HTTP front end (aiohttp.web): OpenAI-compatible routes shaped as vLLM returns them.

Routes: POST /v1/chat/completions, POST /v1/completions (streaming and not; prompt as text or token
ids), GET /v1/models, GET /health (SGLang: also /health_generate), GET /metrics, POST /tokenize,
POST /reset_prefix_cache (SGLang: /flush_cache), GET /version, GET /get_model_info, and in the SGLang
dialect GET /server_info (also /get_server_info).

A streamed response (``sse.py``) follows vLLM: SSE chunks, each with every token the engine produced
since the previous one (one per step when the client keeps up); every response ends with the
request's own timeline in simulated time (``sim_timeline``, ``request.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from agentsweep import __version__
from agentsweep.engine_sim import tokenizer
from agentsweep.engine_sim.disagg import Disagg, DisaggConfig, Plan, ProtocolError
from agentsweep.engine_sim.faults import CRASH, FAIL, STALL, Faults
from agentsweep.engine_sim.metrics import CONTENT_TYPE, Snapshot, build_registry, render
from agentsweep.engine_sim.prompt_memo import PromptBlocks, PromptMemo, Segment
from agentsweep.engine_sim.request import FINISHED, SimRequest
from agentsweep.engine_sim.scheduler import Engine
from agentsweep.engine_sim.sse import SseStream, usage_json

try:  # optional speed-up
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

    def _dumps(obj: Any) -> str:
        return orjson.dumps(obj).decode()

except ImportError:  # pragma: no cover - orjson is installed with the fast extra

    def _loads(data: bytes) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))


DEFAULT_MAX_TOKENS = 256


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_response(message: str, status: int, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def _crash() -> None:
    print("ERROR [core.py] EngineCore encountered a fatal error; engine core process died", flush=True)
    sys.stdout.flush()
    os._exit(1)


@dataclass(slots=True)
class ServerConfig:
    model: str
    served_names: list[str]
    dialect: str = "vllm"
    max_model_len: int = 131072
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    faults: Faults = field(default_factory=Faults)
    crash: Callable[[], None] = _crash


@dataclass(frozen=True, slots=True)
class Admitted:
    """A completion request the server took: what the engine is to compute, and how to answer."""

    body: dict[str, Any]
    prompt: PromptBlocks
    max_tokens: int
    stream_options: dict[str, Any] | None
    plan: Plan
    fault: str | None


class SimServer:
    def __init__(self, config: ServerConfig, engine: Engine, disagg: Disagg | None = None) -> None:
        self.config = config
        self.engine = engine
        # Prefill or decode role of disaggregated serving (``disagg.py``); 'null' serves whole requests.
        self.disagg = disagg or Disagg(DisaggConfig(), engine)
        self.name = config.served_names[0]
        self._name_json = _dumps(self.name)
        self.started = time.monotonic()
        self.retracted_seen = 0
        # Responses held open by the stall fault: frozen requests, still running as the engine reports
        # them (no token comes for them), as a hung engine's requests would be.
        self.stalled = 0
        # Prompts that extend a session's earlier one are tokenized and hashed by their new part only.
        self.prompt_memo = PromptMemo(engine.block_size, hashing=engine.kv.prefix_caching)
        self.registry = build_registry(config.dialect, self.name, engine.stats, self.snapshot)
        # The simulated GPUs' DCGM metrics alone (they are on ``registry`` too, as the engine serves them).
        self.gpu_exporter: CollectorRegistry | None = None
        self.app = web.Application(client_max_size=1 << 30)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)
        r = self.app.router
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        r.add_route("*", "/flush_cache", self.reset_prefix_cache)
        r.add_get("/version", self.version)
        r.add_get("/get_model_info", self.model_info)
        if config.dialect == "sglang":  # SGLang's server arguments; smg reads its admission window here
            for path in ("/server_info", "/get_server_info"):
                r.add_get(path, self.server_info)
        self.disagg.add_routes(r)

    async def _on_startup(self, _app: web.Application) -> None:
        await self.disagg.start()
        self.engine.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.disagg.stop()
        await self.engine.stop()

    # -- state ---------------------------------------------------------------------------------
    @property
    def model_json(self) -> str:
        """The served model's name as JSON text (responses carry it)."""
        return self._name_json

    @property
    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.config.faults.slow_start

    def snapshot(self) -> Snapshot:
        e = self.engine
        kv = e.kv
        bs = e.block_size
        retracted = e.stats.preemptions - self.retracted_seen
        self.retracted_seen = e.stats.preemptions
        return Snapshot(
            running=e.num_running + self.stalled,
            waiting=e.num_waiting,
            gpu_usage=kv.usage,
            gpu_blocks=kv.total,
            block_size=bs,
            used_tokens=kv.used * bs,
            cpu_used_tokens=kv.cpu_used * bs,
            cpu_total_tokens=kv.cpu_capacity * bs,
            bytes_gpu_to_cpu=kv.bytes_gpu_to_cpu,
            bytes_cpu_to_gpu=kv.bytes_cpu_to_gpu,
            evicted_tokens=kv.evicted_blocks * bs,
            retracted_last=retracted,
            pinned_blocks=e.pinned_blocks,
        )

    # -- simple routes -------------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503, text="starting")
        return web.Response(status=200)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry), headers={"Content-Type": CONTENT_TYPE})

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": f"{__version__}+engine-sim"})

    async def models(self, _request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": self.config.dialect,
                "root": self.config.model,
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "vocab_size": tokenizer.MAX_TOKEN_ID + 1,  # every id it accepts in a completions prompt
            }
            for name in self.config.served_names
        ]
        return web.json_response({"object": "list", "data": data})

    async def model_info(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": self.config.model, "tokenizer_path": self.config.model, "is_generation": True}
        )

    async def server_info(self, _request: web.Request) -> web.Response:
        """The part of SGLang's server info a gateway reads (its running window and role)."""
        return web.json_response(
            {
                "model_path": self.config.model,
                "served_model_name": self.name,
                "max_running_requests": self.engine.max_seqs,
                "disaggregation_mode": self.disagg.mode,
                "version": __version__,
            }
        )

    async def reset_prefix_cache(self, _request: web.Request) -> web.Response:
        # As vLLM (409) and SGLang (400) do, refuse while requests hold blocks: a reset then would
        # leave part of the cache in place.
        busy = self.engine.num_running + self.engine.num_waiting
        sglang = self.config.dialect == "sglang"
        if busy:
            print(f"WARNING prefix cache not reset: {busy} requests running or waiting", flush=True)
            if sglang:
                return web.Response(status=400, text="Cache not flushed because there are pending requests.")
            return error_response("Prefix cache reset failed.", 409, "ConflictError")
        self.engine.reset_prefix_cache()
        print("INFO prefix cache reset", flush=True)
        return web.Response(status=200, text="Cache flushed." if sglang else "")

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = self.parse_body(await request.read())
            segments, closing = self._segments(body, "messages" in body)
        except BadRequest as err:
            return error_response(str(err), err.status, err.kind)
        ids = tokenizer.segment_ids(segments, closing)
        return web.json_response(
            {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids, "token_strs": None}
        )

    # -- request parsing -----------------------------------------------------------------------
    def parse_body(self, data: bytes) -> dict[str, Any]:
        try:
            body = _loads(data)
        except ValueError as err:
            raise BadRequest(f"request body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest("'model' must be a string")
        # As vLLM: the served names only (the model path too when no name was given); none or "" is
        # the first served name.
        if model and model not in self.config.served_names:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        return body

    def _segments(self, body: dict[str, Any], chat: bool) -> tuple[list[Segment], tuple[int, ...]]:
        """The prompt as segments and closing ids (see ``prompt_memo``)."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list")
            try:
                texts, closing = tokenizer.chat_segments(
                    messages, bool(body.get("add_generation_prompt", True))
                )
            except ValueError as err:
                raise BadRequest(str(err)) from None
            return list[Segment](texts), closing
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return [((), prompt)], ()
        if isinstance(prompt, list) and prompt and tokenizer.is_token_ids(prompt):
            return [((), prompt)], ()
        raise BadRequest(
            "'prompt' must be a string or a list of token ids (integers from 0 to "
            f"{tokenizer.MAX_TOKEN_ID}; one prompt per request)"
        )

    def _prompt(self, body: dict[str, Any], chat: bool, session: str | None) -> PromptBlocks:
        segments, closing = self._segments(body, chat)
        return self.prompt_memo.blocks(segments, closing, session)

    def _max_tokens(self, body: dict[str, Any], prompt_len: int) -> int:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
        limit = self.config.max_model_len
        if value is None:
            value = max(1, min(self.config.default_max_tokens, limit - prompt_len))
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest("'max_tokens' must be a positive integer")
        if prompt_len + value > limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + value} tokens ({prompt_len} in the messages, {value} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        if not self.engine.fits(prompt_len + value):
            raise BadRequest(
                f"the request needs {prompt_len + value} tokens of KV cache but the GPU pool holds "
                f"{self.engine.kv.total * self.engine.block_size}"
            )
        n = body.get("n", 1)
        if n != 1:
            raise BadRequest("only n=1 is supported")
        return value

    # -- completions ---------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    def admit(self, data: bytes, headers: Mapping[str, str], chat: bool) -> Admitted | web.Response:
        """Take a completion request (its body and headers), or the error response that refuses it.
        The HTTP routes and an in-process caller (``agentsweep.virtual``) both come through here."""
        if not self.ready:
            return error_response("server is starting", 503, "ServiceUnavailableError")
        try:
            body = self.parse_body(data)
            prompt = self._prompt(body, chat, headers.get("X-Session-ID"))
            if not prompt.length:
                raise BadRequest("The decoder prompt cannot be empty")
            max_tokens = self._max_tokens(body, prompt.length)
            opts = body.get("stream_options")
            if opts is not None and not isinstance(opts, dict):
                raise BadRequest("'stream_options' must be an object")
            plan = self.disagg.plan(body, headers.get("X-Request-ID"))
        except (BadRequest, ProtocolError) as err:
            return error_response(str(err), err.status, err.kind)
        if plan.role == "prefill":
            max_tokens = 1  # a prefill instance computes the prompt and its first token only
        fault = self.config.faults.next_request()
        if fault == CRASH:
            self.config.crash()
        if fault == FAIL:
            return error_response("simulated engine failure", 500, "InternalServerError")
        return Admitted(body, prompt, max_tokens, opts, plan, fault)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        admitted = self.admit(await request.read(), request.headers, chat)
        if isinstance(admitted, web.Response):
            return admitted
        body, prompt, max_tokens, opts = (
            admitted.body,
            admitted.prompt,
            admitted.max_tokens,
            admitted.stream_options,
        )
        plan, fault = admitted.plan, admitted.fault
        prefill_s = 0.0
        if plan.role == "decode":
            try:
                prefill_s = await self.disagg.fetch(plan, prompt.length)
            except ProtocolError as err:
                return error_response(str(err), err.status, err.kind)
        req = self.engine.submit(
            prompt,
            max_tokens,
            remote=plan.role == "decode",
            pin=plan.role == "prefill",
            request_id=request.headers.get("X-Request-ID"),
        )
        if plan.role == "decode":
            req.prefill_s = prefill_s
            req.on_loaded = lambda: self.disagg.release(plan)
        stall_at = max(1, max_tokens // 2) if fault == STALL else None
        try:
            if body.get("stream"):
                include_usage = bool((opts or {}).get("include_usage"))
                limit = max_tokens if stall_at is None else stall_at
                stream = SseStream(self.engine, req, chat, self._name_json, include_usage, limit)
                hold = (lambda: self._hold_stalled(req, request)) if stall_at is not None else None
                return await stream.run(request, hold=hold)
            return await self._whole(request, req, chat, stall_at, plan)
        finally:
            if req.status != FINISHED:
                self.engine.abort(req)
            if plan.role == "prefill":
                self.disagg.settle(plan, req)
            elif plan.role == "decode":
                self.disagg.release(plan)

    @staticmethod
    def _own_address(request: web.Request) -> tuple[str, int]:
        """Host and port this server was reached on (where a decode finds a prefill's blocks)."""
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        host = request.url.host or "127.0.0.1"
        if sock and sock[0] not in ("0.0.0.0", "::", ""):
            host = sock[0]
        port = sock[1] if sock else (request.url.port or 80)
        return host, port

    async def _hold_stalled(self, req: SimRequest, request: web.Request) -> None:
        """The stall fault: the request stops where it is (nothing more is computed for it) and stays
        running in the engine's figures until the client goes away."""
        self.engine.abort(req)
        self.stalled += 1
        try:
            await self._wait_disconnect(request)
        finally:
            self.stalled -= 1

    async def _wait_disconnect(self, request: web.Request) -> None:
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)

    async def _whole(
        self,
        request: web.Request,
        req: SimRequest,
        chat: bool,
        stall_at: int | None,
        plan: Plan | None = None,
    ) -> web.Response:
        if stall_at is not None:
            await self._hold_stalled(req, request)
            return web.Response(status=500)
        while req.status != FINISHED:
            req.event.clear()
            await req.event.wait()
        text = tokenizer.output_text(0, req.generated)
        created = int(time.time())
        if chat:
            choice = (
                f'{{"index":0,"message":{{"role":"assistant","content":"{text}","tool_calls":[]}},'
                f'"logprobs":null,"finish_reason":"{req.finish_reason}","stop_reason":null}}'
            )
            rid, obj = f"chatcmpl-{uuid.uuid4().hex}", "chat.completion"
        else:
            choice = f'{{"index":0,"text":"{text}","logprobs":null,"finish_reason":"{req.finish_reason}","stop_reason":null}}'
            rid, obj = f"cmpl-{uuid.uuid4().hex}", "text_completion"
        extra = ""
        if plan is not None and plan.role == "prefill" and plan.protocol == "vllm" and req.pinned:
            self.disagg.publish(plan, req)
            params = self.disagg.transfer_params(plan, req, self._own_address(request))
            extra = f',"kv_transfer_params":{_dumps(params)}'
        body = (
            f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{self._name_json},'
            f'"choices":[{choice}],"usage":{usage_json(req)}{extra},'
            f'"sim_timeline":{req.timeline(self.engine.clock_fields)}}}'
        )
        return web.Response(body=body.encode(), content_type="application/json")
