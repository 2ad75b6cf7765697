"""An OpenAI-compatible chat-completions server on loopback that answers GSM8K-format questions from
their reference answers, a controlled share of them wrong: ``python standin.py DATA_DIR RATE``.

Whether a question is answered right is decided by its text alone (``answers_right``), so a test can
say which ones the harness must score correct. A wrong answer is the reference with its final number
changed by one. Prints ``port N`` once it listens (port 0: any free one).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

from aiohttp import web


def answers_right(question: str, rate: float) -> bool:
    draw = int(hashlib.sha256(question.encode()).hexdigest()[:12], 16) / 16**12
    return draw < rate


def references(data: Path) -> dict[str, str]:
    out = {}
    for split in ("train", "test"):
        for line in (data / f"{split}.jsonl").read_text().splitlines():
            doc = json.loads(line)
            out[doc["question"]] = doc["answer"]
    return out


def make_app(data: Path, rate: float) -> web.Application:
    known = references(data)

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        last = body["messages"][-1]["content"]
        question = last.split("Question:")[-1].split("\nAnswer:")[0].strip()
        reference = known.get(question)
        if reference is None:
            text = "I cannot tell."
        elif answers_right(question, rate):
            text = reference
        else:
            head, _, number = reference.rpartition("#### ")
            text = f"{head}#### {int(number) + 1}"
        return web.json_response(
            {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": len(last.split()),
                    "completion_tokens": len(text.split()),
                    "total_tokens": 0,
                },
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _serve(data: Path, rate: float) -> None:
    runner = web.AppRunner(make_app(data, rate))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"port {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(Path(sys.argv[1]), float(sys.argv[2])))
