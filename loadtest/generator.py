"""The load: a closed loop (N requests kept in flight) or an open loop (requests started on a fixed schedule).

In the open loop a request's latency is measured from the moment it was due,
not from when it was sent: if the server (or this process) falls behind, the
delay shows in the latencies instead of quietly lowering the offered load
(coordinated omission). How late each request actually left is kept too, so
the report can say when the generator itself could not keep up.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc

from attnserve.v1 import encoder_pb2 as pb

EMBED_METHOD = "/attnserve.v1.Encoder/Embed"
# A closed-loop stream told RESOURCE_EXHAUSTED waits before its next request, as a client retrying with
# backoff does (0.05 s, doubling up to 1 s, reset by a reply): without it, N streams would turn a full
# queue into a flood of instant refusals and measure that instead of the server's capacity.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 1.0

Call = Callable[[bytes, float], Awaitable[pb.EmbedResponse]]


@dataclass(frozen=True)
class Sample:
    """One request, times in seconds from the start of the load."""

    due: float  # when it was scheduled (open loop) or sent (closed loop)
    sent: float
    done: float
    code: str  # the grpc status name; OK for a reply
    tokens: int  # real tokens the server computed for it (0 unless OK)
    measured: bool  # due after the warm-up

    @property
    def latency(self) -> float:
        return self.done - self.due


@dataclass(frozen=True)
class LoadShape:
    concurrency: int  # closed loop when > 0
    rate: float  # open loop when > 0
    duration: float  # measured seconds; 0: bounded by requests only
    requests: int  # measured requests; 0: bounded by duration only
    warmup: float


def embed_call(channel: grpc.aio.Channel) -> Call:
    """Embed with the request already serialized, so the generator spends its time waiting, not encoding."""
    method = channel.unary_unary(EMBED_METHOD, request_serializer=None,
                                 response_deserializer=pb.EmbedResponse.FromString)
    return lambda request, timeout: method(request, timeout=timeout)


class LoadGenerator:
    def __init__(self, call: Call, requests: list[bytes], shape: LoadShape, timeout: float):
        self._call, self._requests, self.shape, self._timeout = call, requests, shape, timeout
        self.samples: list[Sample] = []
        self._next = itertools.count()
        self._measured_sent = 0
        self._stop = asyncio.Event()
        self._t0 = 0.0

    def stop(self) -> None:
        """Send nothing more; what is in flight is still awaited and reported."""
        self._stop.set()

    @property
    def stopped_early(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> list[Sample]:
        self._t0 = time.perf_counter()
        if self.shape.rate:
            await self._open_loop()
        else:
            await asyncio.gather(*(self._stream() for _ in range(self.shape.concurrency)))
        return self.samples

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _may_send(self, due: float) -> bool:
        """Whether a request due at this time belongs to the run; counts it as measured if it does."""
        shape = self.shape
        if self._stop.is_set():
            return False
        if due < shape.warmup:
            return True
        if shape.duration and due >= shape.warmup + shape.duration:
            return False
        if shape.requests and self._measured_sent >= shape.requests:
            return False
        self._measured_sent += 1
        return True

    async def _stream(self) -> None:
        backoff = 0.0
        while self._may_send(due := self._now()):
            if await self._one(due) != "RESOURCE_EXHAUSTED":
                backoff = 0.0
                continue
            backoff = min(BACKOFF_MAX_S, backoff * 2 or BACKOFF_FIRST_S)
            if await self._sleep(backoff):
                return

    async def _sleep(self, seconds: float) -> bool:
        """Sleep, or less if stop() comes first; whether it did."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _open_loop(self) -> None:
        interval = 1.0 / self.shape.rate
        in_flight: set[asyncio.Task] = set()
        for i in itertools.count():
            due = i * interval
            if not self._may_send(due):
                break
            delay = due - self._now()
            if delay > 0 and await self._sleep(delay):
                break
            task = asyncio.create_task(self._one(due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)

    async def _one(self, due: float) -> str:
        request = self._requests[next(self._next) % len(self._requests)]
        sent = self._now()
        tokens = 0
        try:
            reply = await self._call(request, self._timeout)
            code, tokens = "OK", sum(e.num_tokens for e in reply.embeddings)
        except grpc.aio.AioRpcError as error:
            code = error.code().name
        except Exception as error:  # counted, never dropped: every request sent has a line in the report
            code = f"CLIENT_ERROR ({type(error).__name__})"
        self.samples.append(Sample(due, sent, self._now(), code, tokens, due >= self.shape.warmup))
        return code
