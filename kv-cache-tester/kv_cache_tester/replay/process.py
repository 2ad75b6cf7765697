"""What every replaying process sets up alike, this one or a --workers child: the event loop and
the payload builder. (Kept apart from app.py, which starts the workers, so that workers.py needs
nothing from app.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from kv_cache_tester.replay.config import ReplayConfig
from kv_cache_tester.replay.prompts import PayloadBuilder


def run_loop(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine on uvloop when importable, else the default loop."""
    factory = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - optional extra
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def make_builder(cfg: ReplayConfig, model: str) -> PayloadBuilder:
    return PayloadBuilder(
        api=cfg.api,
        model=model,
        seed=cfg.seed,
        ignore_eos=cfg.ignore_eos,
        send_max_tokens=not cfg.no_max_tokens,
        mode=cfg.prompt_mode,
        tokenizer=cfg.tokenizer,
        vocab_size=cfg.vocab_size,
    )
