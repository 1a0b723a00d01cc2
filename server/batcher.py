"""The batcher: the only owner of the queue.

Every input of every request enters one queue, in lanes: inputs that asked
for attention weights run an attention graph, the rest the fastest
embeddings graph; an image-text model's images (engine/image_encoder.py)
have lanes of their own beside its texts', each image counted as the
tokens its tower's positions are, so that images share the budget and
admission with texts. An attention batch runs the last-layer graph where every
input in it needs no map but the last layer's and rollout (engine.py
LAST_LAYER_VARIANT), the attention graph of every layer otherwise. One task owns it, as TEI's queue does: handlers only
append and await their futures. The owner

  1. waits until something is queued, then, under load only, up to max_wait
     for a full batch, measured from the oldest input's arrival, so nothing
     that already waited through a running batch waits again; an idle
     server runs a lone request at once (batch_wait.py says when);
  2. drops inputs whose request was cancelled or whose deadline passed;
  3. sorts the oldest waiting inputs of the oldest input's lane by length,
     plans batches under the padded-token budget (max_len x n <=
     max_batch_tokens, n <= max_batch_size) and runs the batch that holds the
     oldest input, so long inputs cannot starve and padding stays small;
  4. hands each caller its rows, or, if the run failed, an error to the
     callers in that batch only.

Admission is bounded in tokens and, optionally, in time: a request gets
QueueFullError at once, never a silent wait, when its tokens do not fit or
when the work queued ahead of it would take longer than max_queue_wait to
run. That time is estimated per lane from the seconds per token of recent
batches, so the bound means the same on a slow CPU and a fast GPU.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry import trace

from attnserve.engine.batching import BATCH_OVERHEAD_CELLS, plan_batches
from attnserve.engine.image_encoder import ImageInput
from attnserve.engine.rows import BatchOutput, RowOutput, normalized_rows, row_of
from attnserve.engine.tokenizer import TokenizedInput
from attnserve.errors import (
    BatchFailedError,
    DeadlineExpiredError,
    QueueFullError,
    ShuttingDownError,
)

from . import tracing
from .batch_pairs import BatchPairs
from .batch_wait import BatchWait
from .metrics import ModelMetrics
from .statistics import BatchTimes

log = logging.getLogger("attnserve.batcher")
_TRACER = trace.get_tracer("attnserve")  # server/tracing.py: the no-op one without --otlp-endpoint
_NO_PARENT = otel_context.Context()  # a batch serves several requests: its span is a root, linked to them

# How many of the oldest waiting inputs one batch is planned from: enough to
# find inputs of similar length, few enough that planning stays ~2 ms on the
# event loop even when the queue holds thousands.
PLAN_WINDOW = 256
# Weight of the newest batch in the running seconds-per-token estimate: a few batches
# follow a change of load, one odd batch does not swing admission.
RATE_WEIGHT = 0.2
# The least retry delay a refused request is told (RetryInfo): the estimate of when the queue has room is 0
# before a lane's speed is known, and a client retrying at once would only be refused again.
MIN_RETRY_AFTER_S = 0.05


@dataclass(frozen=True)
class BatcherLimits:
    max_batch_tokens: int
    max_batch_size: int
    max_queue_tokens: int
    max_wait_s: float
    max_queue_wait_s: float = 0.0  # 0: no time bound
    in_flight: int = 1  # batches run at once (--batches-in-flight); the executor has as many threads
    run_cells: int = BATCH_OVERHEAD_CELLS  # what one more batch costs in padded tokens (EngineConfig.batch_cost_on)


@dataclass(eq=False)
class _Request:
    deadline: float | None  # time.monotonic() value
    waiting: int  # its inputs still in the queue
    span: trace.SpanContext | None = None  # its trace's current span when it was queued (server/tracing.py)
    queued_ns: int = field(default_factory=time.time_ns)  # wall clock, as spans are timed
    started: bool = False  # a batch has taken one of its inputs (its queue wait is over)
    # Its rows keep their token states (the last hidden state); False: their sentence embeddings alone, copied, so
    # that no row holds its batch's [B, T, H] array once the batch is answered (a request of many long inputs).
    token_states: bool = True


QueuedInput = TokenizedInput | ImageInput  # a text (or pair, or token ids), or an image
Lane = tuple[bool, bool]  # (attention, image): a batch is taken from one lane
LANES: tuple[Lane, ...] = ((False, False), (True, False), (False, True), (True, True))


@dataclass(eq=False, slots=True)
class _Entry:
    seq: int  # arrival order
    input: QueuedInput
    lane: Lane  # (attention, an image)
    last_layer: bool  # its request needs no map but the last layer's, and rollout (Engine.run)
    request: _Request
    future: asyncio.Future
    enqueued: float  # time.monotonic()


# Engine.run(inputs, attention, last_layer, token_states, narrow): a batch's inputs are all texts or all images (one
# lane); narrow: on the half-width session (batch_pairs.py)
RunBatch = Callable[[Sequence[QueuedInput], bool, bool, bool, bool], BatchOutput]
PLAIN_TEXT: Lane = (False, False)  # the lane whose batches run on the embeddings graph, the one a pair narrows


def _queue_wait_spans(requests) -> None:
    """Each traced request's `queue wait`: from its admission to the first batch that takes one of its inputs."""
    now = time.time_ns()
    for request in requests:
        if request.started:
            continue
        request.started = True
        if request.span is not None:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(request.span))
            _TRACER.start_span("queue wait", context=parent, start_time=request.queued_ns).end(end_time=now)


class Batcher:
    def __init__(self, run_batch: RunBatch, limits: BatcherLimits, metrics: ModelMetrics, executor: Executor,
                 pairs: BatchPairs | None = None):
        """run_batch is Engine.run; it is called in executor, limits.in_flight batches at a time; metrics: its
        model's. pairs: where the server pairs batches, the model's (batch_pairs.py), which decides each batch's
        width (in_flight is then 2)."""
        self._run_batch, self.limits, self._metrics, self._executor = run_batch, limits, metrics, executor
        self._pairs = pairs
        # Per lane (LANES), insertion-ordered: the first entry is the oldest.
        self._lanes: dict[Lane, dict[int, _Entry]] = {lane: {} for lane in LANES}
        self._lane_tokens = dict.fromkeys(LANES, 0)
        self._seconds_per_token: dict[Lane, float | None] = dict.fromkeys(LANES)
        self._queued_requests = 0
        self._seq = itertools.count()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()  # set as tokens leave the queue (_remove)
        self._in_parts = 0  # requests admitted in parts with parts still to queue: the drain waits for them
        self.wait = BatchWait(limits.max_wait_s)
        self._closed = False
        self._gauges_due = False
        self._running = False
        self._task: asyncio.Task | None = None
        self._slots = asyncio.Semaphore(limits.in_flight)  # a batch is taken only when one is free
        self._runs: set[asyncio.Task] = set()  # the batches running

    # --- the handlers' side -------------------------------------------------

    @property
    def queued_tokens(self) -> int:
        return sum(self._lane_tokens.values())

    @property
    def queued_seconds(self) -> float:
        """Estimated time to run what is queued, from recent batches (0 for a lane not yet measured)."""
        return sum(self._lane_tokens[lane] * (self._seconds_per_token[lane] or 0.0) for lane in LANES)

    def learn_rate(self, attention: bool, seconds: float, tokens: int, cells: int, image: bool = False) -> None:
        """Fold one batch's time into its lane's seconds-per-token estimate (warm-up seeds it).

        Only batches at least half the budget count once there is an estimate: a queue long enough
        to matter drains in full batches, and a lone short input costs several times more per token.
        """
        lane = (attention, image)
        old = self._seconds_per_token[lane]
        if tokens <= 0 or (old is not None and cells < self.limits.max_batch_tokens // 2):
            return
        rate = seconds / tokens
        self._seconds_per_token[lane] = rate if old is None else old + RATE_WEIGHT * (rate - old)

    def check_room(self, n_inputs: int) -> None:
        """Refuse a request before any work is spent on it: the server is draining, or the work queued
        ahead would take longer than max_queue_wait to run."""
        if self._closed:
            raise ShuttingDownError("the server is shutting down; retry on another replica")
        wait_limit = self.limits.max_queue_wait_s
        if wait_limit and self.queued_seconds > wait_limit:
            self._metrics.dropped("queue_full").inc(n_inputs)
            raise QueueFullError(
                f"queue full: about {self.queued_seconds * 1e3:.0f} ms of work waiting, more than the server's "
                f"limit of {wait_limit * 1e3:.0f} ms; retry with backoff",
                retry_after=self._seconds_until_room(self.queued_seconds - wait_limit))

    def _seconds_until_room(self, seconds_of_work: float) -> float:
        """The retry delay of a refused request: the estimated run time of the queued work that must go first."""
        return max(MIN_RETRY_AFTER_S, seconds_of_work)

    async def submit(self, inputs: Sequence[QueuedInput], attention: bool, deadline: float | None,
                     last_layer: bool = False, token_states: bool = True) -> list[RowOutput]:
        """Queue one request's inputs and wait for their rows, in the order given. last_layer (with attention): the
        request needs no map but the last layer's, and rollout. token_states False: the rows' sentence embeddings
        are all the request needs (RowOutput.token_embeddings None).

        Cancelling the awaiting task (client gone, deadline passed) drops the
        inputs that have not run yet.
        """
        self.check_room(len(inputs))  # again: the queue changed while the request was tokenized
        tokens = sum(len(x) for x in inputs)
        capacity = self.limits.max_queue_tokens
        if tokens > capacity:
            return await self._submit_in_parts(inputs, attention, deadline, last_layer, token_states)
        return await self._rows(self._enqueue(inputs, tokens, attention, deadline, last_layer, token_states))

    async def _submit_in_parts(self, inputs: Sequence[QueuedInput], attention: bool, deadline: float | None,
                               last_layer: bool, token_states: bool) -> list[RowOutput]:
        """A request of more tokens than the whole queue holds (a client's big batch: LangChain sends 1,000 texts
        a request): admitted in parts of at most half the queue, in order, each later part queued once the queue
        is at most half full with it, so that it never crowds out the others: they still get in between its
        parts. The first part is refused at once where the queue is full, as any request is; the later ones wait
        for room (the connection waits with them: backpressure), within the request's deadline. Its memory is its
        own inputs and rows, whatever its size."""
        budget = max(self.limits.max_queue_tokens // 2, max(len(x) for x in inputs))
        parts: list[list[QueuedInput]] = [[]]
        part_tokens = [0]
        for x in inputs:
            if parts[-1] and part_tokens[-1] + len(x) > budget:
                parts.append([])
                part_tokens.append(0)
            parts[-1].append(x)
            part_tokens[-1] += len(x)
        # Each part is one queued request; the first is refused at once where there is no room.
        entries = self._enqueue(parts[0], part_tokens[0], attention, deadline, last_layer, token_states)
        self._in_parts += 1  # admitted: a drain starting now lets its later parts in
        try:
            for part, tokens in zip(parts[1:], part_tokens[1:], strict=True):
                await self._room_for(tokens, deadline)
                entries += self._enqueue(part, tokens, attention, deadline, last_layer, token_states)
        except BaseException:
            self._withdraw(entries)  # what has not run of the parts queued must not cost compute
            raise
        finally:
            self._in_parts -= 1
            self._arrived.set()  # a closed, empty queue's owner may stop now
        return await self._rows(entries)

    async def _room_for(self, tokens: int, deadline: float | None) -> None:
        """Until the queue, with this part, is at most half full (DeadlineExpiredError once the deadline passes):
        the other half stays free for other requests, which would else be refused while a big request's parts
        filled the queue. A part of one input longer than half the queue waits for an empty queue. A drain does
        not end the wait: the request was admitted, and its parts are answered."""
        ceiling = max(self.limits.max_queue_tokens // 2, tokens)
        while self.queued_tokens + tokens > ceiling:
            self._room.clear()
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise DeadlineExpiredError("the deadline passed while the request waited for room in the queue")
            try:
                await asyncio.wait_for(self._room.wait(), timeout)
            except TimeoutError:
                raise DeadlineExpiredError("the deadline passed while the request waited for room in the queue"
                                           ) from None

    def _enqueue(self, inputs: Sequence[QueuedInput], tokens: int, attention: bool, deadline: float | None,
                 last_layer: bool, token_states: bool = True) -> list[_Entry]:
        """Queue one request's inputs (or one part's), or refuse them at once: the queue has no room for them, or
        the deadline has passed."""
        capacity = self.limits.max_queue_tokens
        if self.queued_tokens + tokens > capacity:
            self._metrics.dropped("queue_full").inc(len(inputs))
            excess = self.queued_tokens + tokens - capacity
            raise QueueFullError(
                f"queue full: {self.queued_tokens} of {capacity} tokens waiting, this request needs {tokens}; "
                "retry with backoff", retry_after=self._seconds_until_room(self.queued_seconds * excess
                                                                          / max(1, self.queued_tokens)))
        if deadline is not None and deadline <= time.monotonic():
            raise DeadlineExpiredError("the deadline passed before the request was queued")
        loop = asyncio.get_running_loop()
        current = trace.get_current_span().get_span_context() if tracing.enabled() else None
        request = _Request(deadline, len(inputs), current if current is not None and current.is_valid else None,
                           token_states=token_states)
        now, last_layer = time.monotonic(), attention and last_layer
        entries = [_Entry(next(self._seq), x, (attention, isinstance(x, ImageInput)), last_layer, request,
                          loop.create_future(), now) for x in inputs]
        for entry in entries:
            self._lanes[entry.lane][entry.seq] = entry
            self._lane_tokens[entry.lane] += len(entry.input)
        self._queued_requests += 1
        self.wait.arrived()
        self._update_gauges()
        self._arrived.set()
        return entries

    async def _rows(self, entries: list[_Entry]) -> list[RowOutput]:
        """The entries' rows, in order, once all have run."""
        try:
            if len(entries) == 1:  # most requests: one input, no gathering future
                return [await entries[0].future]
            return list(await asyncio.gather(*(e.future for e in entries)))
        except BaseException:
            # Cancelled, or one input's batch failed: what has not run yet must not cost compute.
            self._withdraw(entries)
            raise

    def _withdraw(self, entries: list[_Entry]) -> None:
        """A request's entries that will not be awaited (it was cancelled, or failed): each still queued leaves
        the queue, its future cancelled. The only place a queued entry's future is cancelled, so none is left
        queued (the owner's _runnable drops one that is, in case)."""
        for entry in entries:
            entry.future.cancel()
            self._remove(entry, "cancelled")

    # --- the owner ----------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._own_queue(), name="attnserve-batcher")

    def close(self) -> None:
        """Take no new requests; what is queued still runs."""
        self._closed = True
        self._arrived.set()
        self._room.set()

    async def join(self) -> None:
        """Wait until the queue is empty, the owner has stopped and every batch has answered (after close)."""
        if self._task is not None:
            await self._task
        while self._runs:
            await asyncio.wait(set(self._runs))

    async def _own_queue(self) -> None:
        while True:
            if not any(self._lanes.values()):
                if self._closed and not self._in_parts:  # a request admitted in parts is answered whole
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            try:
                # Formed only once it can run: with every slot taken, the queue goes on filling the next batch.
                await self._slots.acquire()
                try:
                    await self._wait_to_fill()
                    if self._pairs is not None:
                        await self._pairs_allow()
                    taken = self._take_batch()
                except BaseException:
                    self._slots.release()
                    raise
                if not taken:
                    self._slots.release()
                else:  # with one slot, the next acquire waits for this batch as an await of it would
                    half = self._pairs is not None and self._pairs.choose(taken[0].lane == PLAIN_TEXT,
                                                                           any(self._lanes.values()))
                    run = asyncio.get_running_loop().create_task(self._run_in_slot(taken, half))
                    self._runs.add(run)
                    run.add_done_callback(self._runs.discard)
            except Exception as error:  # a bug here must not leave callers waiting forever
                log.error("batcher error; failing the queued requests", exc_info=error,
                          extra={"fields": {"event": "batcher_error"}})
                self._fail_queued(BatchFailedError(f"the server's batcher failed ({type(error).__name__}); retry"))

    async def _pairs_allow(self) -> None:
        """Where batches are paired: wait while a full-width batch runs, and for an idle CPU where the next batch
        can only run at full width (attention, images)."""
        assert self._pairs is not None
        await self._pairs.until_no_full()
        if any(self._lanes.values()) and self._oldest_lane() != PLAIN_TEXT:
            await self._pairs.until_idle()

    async def _run_in_slot(self, batch: list[_Entry], half: bool = False) -> None:
        """A batch in flight; its slot is free again once it has answered. half: on the half-width session, paired
        (batch_pairs.py)."""
        try:
            await self._run(batch, half)
        except Exception as error:  # a bug: its callers get an error, never silence
            log.error("batcher error; failing the batch", exc_info=error, extra={"fields": {"event": "batcher_error"}})
            failure = BatchFailedError(f"the server's batcher failed ({type(error).__name__}); retry")
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(failure)
        finally:
            if self._pairs is not None:
                self._pairs.ended(half)
            self._slots.release()

    def _fail_queued(self, error: Exception) -> None:
        for lane in self._lanes.values():
            for entry in list(lane.values()):
                self._remove(entry, "error")
                if not entry.future.done():
                    entry.future.set_exception(error)

    def _oldest_lane(self) -> Lane:
        heads = [(next(iter(entries)), lane) for lane, entries in self._lanes.items() if entries]
        return min(heads)[1]

    def _full(self, lane: Lane) -> bool:
        return (self._lane_tokens[lane] >= self.limits.max_batch_tokens
                or len(self._lanes[lane]) >= self.limits.max_batch_size)

    async def _wait_to_fill(self) -> None:
        while not self._closed and any(self._lanes.values()):
            lane = self._oldest_lane()
            if self._full(lane):
                return
            oldest = next(iter(self._lanes[lane].values()))
            left = oldest.enqueued + self.wait.wait_s() - time.monotonic()
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                return

    def _take_batch(self) -> list[_Entry]:
        """Remove and return the next batch: the oldest input and those of similar length."""
        if not any(self._lanes.values()):
            return []
        lane = self._lanes[self._oldest_lane()]
        candidates = self._runnable(list(itertools.islice(lane.values(), PLAN_WINDOW)), time.monotonic())
        if not candidates:
            return []
        lengths = np.fromiter((len(e.input) for e in candidates), dtype=np.int64, count=len(candidates))
        plan = plan_batches(lengths, self.limits.max_batch_tokens, self.limits.max_batch_size,
                            self.limits.run_cells)
        # candidates[0] is the oldest: run the batch that holds it.
        chosen = next(batch for batch in plan if 0 in batch)
        taken = [candidates[i] for i in sorted(chosen)]
        for entry in taken:
            self._remove(entry, None, gauges=False)
        self._update_gauges()  # once for the batch
        self.wait.batch_started()
        return taken

    def _runnable(self, entries: list[_Entry], now: float) -> list[_Entry]:
        """The entries that may still run; the others leave the queue. An entry whose future is done was cancelled
        (only the owner answers a queued entry, and takes it out first; _withdraw takes out what it cancels, so this
        is a safeguard): it must neither run nor be answered (a cancelled future takes no exception). An entry
        whose deadline passed gets DeadlineExpiredError."""
        runnable = []
        for entry in entries:
            deadline = entry.request.deadline
            if entry.future.done():
                self._remove(entry, "cancelled")
            elif deadline is not None and deadline <= now:
                self._remove(entry, "deadline")
                entry.future.set_exception(DeadlineExpiredError("the deadline passed while the request was queued"))
            else:
                runnable.append(entry)
        return runnable

    def _remove(self, entry: _Entry, reason: str | None, gauges: bool = True) -> None:
        """Take an entry out of the queue, once; reason is why it will not run, None when it will. gauges False: the
        caller updates the queue's gauges once it has removed several."""
        if self._lanes[entry.lane].pop(entry.seq, None) is None:
            return
        self._lane_tokens[entry.lane] -= len(entry.input)
        self._room.set()  # a request admitted in parts may queue its next one
        entry.request.waiting -= 1
        if entry.request.waiting == 0:
            self._queued_requests -= 1
        if reason is not None:
            self._metrics.dropped(reason).inc()
        if gauges:
            self._update_gauges()

    def _update_gauges(self) -> None:
        """The queue's gauges, set once at the end of the event loop's turn however often the queue changed in it
        (each set takes a lock: under load, several a request)."""
        if not self._gauges_due:
            self._gauges_due = True
            asyncio.get_running_loop().call_soon(self._set_gauges)

    def _set_gauges(self) -> None:
        self._gauges_due = False
        self._metrics.queue_tokens.set(self.queued_tokens)
        self._metrics.queue_seconds_estimate.set(self.queued_seconds)
        self._metrics.queue_requests.set(self._queued_requests)

    async def _run(self, batch: list[_Entry], half: bool = False) -> None:
        attention, image = batch[0].lane
        # The last-layer graph where it answers every input of the batch (and the artifacts have it: Engine.run).
        last_layer = attention and not image and all(e.last_layer for e in batch)
        graph = ("image_" if image else "") + ("attention" if attention else "embeddings")
        started = time.monotonic()
        for entry in batch:
            self._metrics.observe_queue(started - entry.enqueued)
        inputs = [e.input for e in batch]
        tokens = sum(len(x) for x in inputs)
        cells = max(len(x) for x in inputs) * len(inputs)
        span: trace.Span = trace.INVALID_SPAN
        if tracing.enabled():
            requests = {id(e.request): e.request for e in batch}.values()
            _queue_wait_spans(requests)
            span = _TRACER.start_span("batch run", context=_NO_PARENT, links=[
                trace.Link(r.span) for r in requests if r.span is not None], attributes={
                "attnserve.batch_size": len(batch), "attnserve.tokens": tokens, "attnserve.cells": cells,
                "attnserve.graph": graph})
        try:
            executor = self._pairs.executor if half and self._pairs is not None else self._executor
            out = await asyncio.get_running_loop().run_in_executor(
                executor, self._run_batch, inputs, attention, last_layer,
                any(e.request.token_states for e in batch), half)
            rows = out.scores if out.scores is not None else out.sentence_embedding
            if rows is None or len(rows) != len(batch):
                raise RuntimeError(f"the session returned {0 if rows is None else len(rows)} rows for "
                                   f"{len(batch)} inputs")
        except Exception as error:
            self._metrics.failed_batches.inc()
            log.error("batch failed", exc_info=error,
                      extra={"fields": {"event": "batch_failed", "graph": graph, "size": len(batch), "tokens": tokens}})
            failure = BatchFailedError(
                f"the batch this request ran in failed ({type(error).__name__}); the server is still serving, "
                "retry the request")
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(failure)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
            span.end()
            return
        span.end()
        seconds = time.monotonic() - started
        if out.map_layers is not None:
            graph = "attention_last"
        self.learn_rate(attention, seconds, tokens, cells, image)
        log.debug("batch", extra={"fields": {
            "event": "batch", "graph": graph, "size": len(batch), "tokens": tokens, "cells": cells,
            "padding": round((cells - tokens) / cells, 4), "ms": round(seconds * 1e3, 2), "half": half,
            "queued_tokens": self.queued_tokens}})
        cutting = time.perf_counter()
        self._answer(batch, out)
        # Recorded before the loop runs the requests' continuations: a reply never precedes its batch's counts.
        self._metrics.observe_batch(graph, len(batch), tokens, cells, seconds, BatchTimes(
            out.feed_seconds, out.run_seconds, time.perf_counter() - cutting))

    @staticmethod
    def _answer(batch: list[_Entry], out: BatchOutput) -> None:
        """Each entry's rows of the batch's outputs, to its future (engine/rows.py)."""
        normalized = normalized_rows(out)  # (B, D)
        for row, entry in enumerate(batch):
            if entry.future.done():  # its request was cancelled while the batch ran
                continue
            entry.future.set_result(row_of(out, row, len(entry.input), entry.request.token_states, normalized))
