"""A registry front that asks for a bearer token as Docker Hub does, run as its own process:

``python token_gate.py --upstream HOST:PORT --port P --log FILE [--refuse-tokens]``

Requests to ``/v2/...`` without a token for their repository's pull scope get 401 with
``WWW-Authenticate: Bearer realm="http://127.0.0.1:P/token",service="loopback-registry",scope=...``;
``/token`` hands out an anonymous token for the scope asked (each query it gets is appended to FILE as
a JSON line), or 401 with --refuse-tokens; with a valid token a request goes on to the real registry.
"""

from __future__ import annotations

import argparse
import json
import secrets
from pathlib import Path

import aiohttp
from aiohttp import web


def app(upstream: str, port: int, log: Path, refuse_tokens: bool) -> web.Application:
    tokens: dict[str, str] = {}  # token -> scope

    async def token(request: web.Request) -> web.Response:
        with log.open("a") as f:
            f.write(json.dumps(dict(request.query)) + "\n")
        if refuse_tokens:
            return web.Response(status=401, text="no")
        value = secrets.token_hex(16)
        tokens[value] = request.query.get("scope", "")
        return web.json_response({"token": value, "expires_in": 300})

    async def v2(request: web.Request) -> web.Response:
        path = request.match_info["path"]
        scope = f"repository:{path.split('/manifests/')[0]}:pull"
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if tokens.get(given) != scope:
            challenge = (
                f'Bearer realm="http://127.0.0.1:{port}/token",service="loopback-registry",scope="{scope}"'
            )
            return web.Response(status=401, headers={"WWW-Authenticate": challenge})
        accept = {"Accept": request.headers.get("Accept", "")}
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, f"http://{upstream}/v2/{path}", headers=accept) as resp,
        ):
            keep = {k: v for k, v in resp.headers.items() if k in ("Docker-Content-Digest", "Content-Type")}
            return web.Response(status=resp.status, headers=keep, body=await resp.read())

    application = web.Application()
    application.router.add_get("/token", token)
    application.router.add_route("*", "/v2/{path:.*}", v2)
    return application


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--refuse-tokens", action="store_true")
    args = parser.parse_args()
    web.run_app(
        app(args.upstream, args.port, args.log, args.refuse_tokens),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
