"""Write request bodies at once on Python 3.11 (aiohttp already does this on 3.12+).

aiohttp sends a request's headers and body from a separate task (``ClientRequest.write_bytes``).
On Python 3.12+ it starts that task eagerly, so a body that fits the socket buffer goes out inside
``session.post()``. On 3.11 the task only runs on a later loop iteration, after whatever else is
ready (other users' stream chunks, their completions): that delay lands inside the measured TTFT.
:func:`eager_body_writes` installs a loop task factory that runs the first step of that one
coroutine immediately, as 3.12's eager tasks do; every other task is created as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import types
from collections.abc import Coroutine, Generator, Iterator
from typing import Any

_EAGER_QUALNAME = "ClientRequest.write_bytes"


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], pending: Any) -> Generator[Any, Any, Any]:
    """Drive an already started coroutine from its first suspension on, inside a Task."""
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # cancellation (or another error) thrown in by the Task
            try:
                pending = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _reraise(exc: BaseException) -> None:
    raise exc


def _factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
    if getattr(coro, "__qualname__", None) != _EAGER_QUALNAME:
        return asyncio.Task(coro, loop=loop, **kwargs)
    if kwargs.get("context") is None:  # the first step runs in the task's own context, as in 3.12
        kwargs["context"] = contextvars.copy_context()
    try:
        pending = kwargs["context"].run(coro.send, None)
    except StopIteration as stop:  # finished in one step: the usual case
        fut = loop.create_future()
        fut.set_result(stop.value)
        return fut
    except BaseException as exc:  # let the task raise it, as it would have without the factory
        return asyncio.Task(_reraise(exc), loop=loop, **kwargs)
    return asyncio.Task(_resume(coro, pending), loop=loop, **kwargs)


@contextlib.contextmanager
def eager_body_writes(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Within the block, aiohttp request bodies are written when the request is sent."""
    if sys.version_info >= (3, 12) or loop.get_task_factory() is not None:
        yield
        return
    loop.set_task_factory(_factory)
    try:
        yield
    finally:
        loop.set_task_factory(None)
