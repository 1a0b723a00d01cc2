"""How wide a model's next CPU batch runs when the server pairs batches (ServerConfig.pair_batches).

On a CPU one batch on every core gives a lone request its shortest wait, but under load the door's work on the same
cores stalls each of that batch's parallel steps (docs/performance.md, "Serving": a third of a core taken costs
the graph about half its speed). Two batches at once on half the cores each are not slowed by it. So: a batch that
would run with nothing beside it and nothing more queued runs at full width (Engine's own session); while another
batch runs, or more is queued, it runs at half width (Engine.open_narrow_session), two at once. A full-width batch
never runs beside another: nothing starts while one runs. Batches of attention or images (their own sessions, on
every core) run at full width, once the half-width ones have ended.

One per model, shared by its batchers (a model's tasks share its cores), all on the event loop's thread. The
half-width batches run in two threads of their own (executor), the full-width ones in the batchers' thread: a
session called from one thread after another ran slower (idle p99 of MiniLM's one-text batches 11 to 14 ms after a
load, against 5 ms from one thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor


class BatchPairs:
    def __init__(self, executor: Executor) -> None:
        self.executor = executor  # the half-width batches' two threads
        self.full = 0  # full-width batches running
        self.half = 0  # half-width ones
        self._changed = asyncio.Event()

    async def until(self, ready: Callable[[], bool]) -> None:
        """Wait until ready() holds, rechecked whenever a batch ends."""
        while not ready():
            self._changed.clear()
            await self._changed.wait()

    async def until_no_full(self) -> None:
        await self.until(lambda: self.full == 0)

    async def until_idle(self) -> None:
        await self.until(lambda: self.full == 0 and self.half == 0)

    def choose(self, narrowable: bool, more_queued: bool) -> bool:
        """Whether the batch taken now runs at half width (and count it as running): narrowable, a batch of the
        embeddings graph; more_queued, inputs are left in the queue after it."""
        half = narrowable and (self.half > 0 or more_queued)
        if half:
            self.half += 1
        else:
            self.full += 1
        return half

    def ended(self, half: bool) -> None:
        if half:
            self.half -= 1
        else:
            self.full -= 1
        self._changed.set()
