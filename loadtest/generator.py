"""The load: a closed loop (N requests kept in flight) or an open loop (requests started on a fixed schedule).

In the open loop a request's latency is measured from the moment it was due,
not from when it was sent: if the server (or this process) falls behind, the
delay shows in the latencies instead of quietly lowering the offered load
(coordinated omission). How late each request actually left is kept too, so
the report can say when the generator itself could not keep up.

A refused request (a retryable code: the target is down, draining or shedding)
is retried as retry.py says, and neither loop ever sends again at once:

  closed loop  the stream waits its backoff before its next send, the retry or,
               once the request is given up, the next request. Without the
               wait, N streams facing a stopped server would send as fast as
               refusals come back (thousands per second) and measure that.
  open loop    new requests keep their schedule, whatever the target does:
               holding them back would hide the outage from the latencies, as
               above, and the schedule already bounds their rate. A refused
               request is retried after its own backoff, on top of the schedule
               but bounded by the retry throttle, so a target that is down gets
               the scheduled rate and a few retries, not a multiple of it.

Every send is a sample of its own: retries are counted as sent and answered
under their own status code, and flagged so the report can say how many.

The generator knows no protocol: a Call (grpc_call.py, http_call.py) sends a
request's bytes and says what came back as an Answer.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from attnserve.client.retry import MAX_ATTEMPTS, Backoff, RetryThrottle


@dataclass(frozen=True)
class Answer:
    """What one send came back with, in the protocol's own words."""

    code: str  # gRPC: the status name (OK, UNAVAILABLE); HTTP: the status ("200", "429") or what failed to connect
    ok: bool
    tokens: int = 0  # real tokens the server computed (0 unless ok)
    refused: bool = False  # a retryable answer: the same request sent later can succeed
    retry_after: float | None = None  # the server's own wait before a retry (RetryInfo, Retry-After), if it gave one


# Sends a serialized request with a timeout in seconds; never raises for an answer the server or network gave.
Call = Callable[[bytes, float], Awaitable[Answer]]


@dataclass(frozen=True)
class Sample:
    """One request, times in seconds from the start of the load."""

    due: float  # when it was scheduled (open loop) or sent (closed loop)
    sent: float
    done: float
    code: str  # Answer.code
    ok: bool
    tokens: int  # real tokens the server computed for it (0 unless OK)
    measured: bool  # due after the warm-up
    retry: bool  # a refused request sent again

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


class LoadGenerator:
    def __init__(self, call: Call, requests: list[bytes], shape: LoadShape, timeout: float):
        self._call, self._requests, self.shape, self._timeout = call, requests, shape, timeout
        self.samples: list[Sample] = []
        self._next = itertools.count()
        self._measured_sent = 0
        self._stop = asyncio.Event()
        self._throttle = RetryThrottle()
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

    def _next_request(self) -> bytes:
        return self._requests[next(self._next) % len(self._requests)]

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
        """One closed-loop stream: a request in flight, the next sent when it is answered, or after a backoff."""
        backoff = Backoff()
        request, attempts = None, 0
        while True:
            if request is None:
                request, attempts = self._next_request(), 0
            if not self._may_send(due := self._now()):
                return
            answer = await self._one(request, due, retry=attempts > 0)
            attempts += 1
            if not answer.refused:
                backoff.reset()
                request = None
                continue
            if attempts == MAX_ATTEMPTS or not self._throttle.allows_retry:
                request = None  # given up: its refusals are counted; the stream still waits before the next
            if await self._sleep(backoff.next(answer.retry_after)):
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
            task = asyncio.create_task(self._scheduled(self._next_request(), due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)

    async def _scheduled(self, request: bytes, due: float) -> None:
        """One open-loop request, and its retries while it is refused, each due after its own backoff."""
        backoff, retry_after = Backoff(), None
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                due = self._now() + backoff.next(retry_after)
                if await self._sleep(due - self._now()) or not self._may_send(due):
                    return
            answer = await self._one(request, due, retry=attempt > 0)
            if not answer.refused or not self._throttle.allows_retry:
                return
            retry_after = answer.retry_after

    async def _one(self, request: bytes, due: float, retry: bool) -> Answer:
        """Send once and record the answer."""
        sent = self._now()
        try:
            answer = await self._call(request, self._timeout)
        except Exception as error:  # counted, never dropped: every request sent has a line in the report
            answer = Answer(f"CLIENT_ERROR ({type(error).__name__})", ok=False)
        if answer.ok:
            self._throttle.succeeded()
        elif answer.refused:
            self._throttle.refused()
        self.samples.append(Sample(due, sent, self._now(), answer.code, answer.ok, answer.tokens,
                                   due >= self.shape.warmup, retry))
        return answer
