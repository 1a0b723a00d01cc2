"""A request held while a graph it needs is built, so that a model's first call is answered, more slowly.

The first request for attention weights or int8 embeddings may need a graph that the artifact directory does not
hold yet (engine/builds.py builds it in the background, seconds to minutes). TEI, vLLM and Infinity answer every
first request; so does attnserve: prepare() checks everything that could refuse the request first, then requires
the graph, and the core holds the request here until the build ends. The request is then prepared again (its
tokens read the new manifest) and runs. What ends the wait:

- the build: the request runs;
- the build failing: GraphUnavailableError, the build's own message;
- the request's deadline: the core's deadline cancels this wait like any other (DeadlineExpiredError);
- --max-build-wait, the server-wide bound: the last GraphBuildingError, retryable with Retry-After (0 refuses at
  once, as before this module);
- the drain: ShuttingDownError, retryable on another replica (a build outlasts any drain's grace).

While it waits, the request asks its engine again for what it needs alone (GraphBuildingError.needs), never
preparing itself again until the graph is there, at most once a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

from attnserve.errors import GraphBuildingError, ShuttingDownError

T = TypeVar("T")
# How soon a held request asks again, doubling up to the most: a build's end is seen within a second, at a cost of
# one cheap manifest check a second per request held.
FIRST_POLL_SECONDS, MOST_POLL_SECONDS = 0.2, 1.0


async def once_built(prepare: Callable[[], Awaitable[T]], require: Callable[[Sequence[str], str], object],
                     executor: Executor, most_wait: float, draining: asyncio.Event) -> T:
    """prepare()'s result, waiting out every GraphBuildingError it raises (module docstring). require: the engine's
    (Engine.require, or the engine process's through a worker: called off the event loop, in executor)."""
    held_until = None
    while True:
        try:
            return await prepare()
        except GraphBuildingError as building:
            if held_until is None:
                held_until = time.monotonic() + most_wait
            await _until_built(building, require, executor, held_until, most_wait, draining)


async def _until_built(building: GraphBuildingError, require: Callable[[Sequence[str], str], object],
                       executor: Executor, held_until: float, most_wait: float, draining: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    delay = FIRST_POLL_SECONDS
    while True:
        left = held_until - time.monotonic()
        if left <= 0:
            raise GraphBuildingError(
                f"{building}; this server holds a request at most {most_wait:g} s (--max-build-wait) while a graph "
                "is built: retry shortly", building.retry_after, building.needs, building.what) from None
        try:  # the drain ends the wait at once
            await asyncio.wait_for(draining.wait(), min(delay, left))
        except asyncio.TimeoutError:
            pass
        else:
            raise ShuttingDownError(f"the server is shutting down while {building.what or 'a graph'} this request "
                                    "needs is built; retry on another replica") from None
        delay = min(2 * delay, MOST_POLL_SECONDS)
        try:
            await loop.run_in_executor(executor, require, building.needs, building.what)
            return
        except GraphBuildingError as still:
            building = still
