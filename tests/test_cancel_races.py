"""Cancels and deadlines raced against the batcher at every point of a request's life, and a bounded gRPC soak.

A soak of 4 gRPC clients once got INTERNAL on every kind of request: a queued input whose future its caller had
cancelled still sat in the queue (the done callback that takes it out runs a loop turn later) when its deadline
passed, the batcher set an exception on that cancelled future, and the InvalidStateError failed the whole queue;
and a call that its deadline had ended already was aborted (grpc's ExecuteBatchError, logged at error).

Each race here is placed where it happens, in the real batcher over the real engine: a step of the batcher is
wrapped (monkeypatch) to cancel at one exact point, and a runner holds batches in the session until the test lets
them go. Each test checks that the other requests get their own rows, that the batcher serves on, its queue
empty, and that nothing was logged at error level. The gRPC door's part is checked on a server in this process, on
a loopback port: a call whose deadline ended it is never aborted, and a soak of 4 clients mixing every kind of call
gets no INTERNAL and logs nothing at error level.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import grpc
import numpy as np
import pytest

from attnserve.config import ServerConfig
from attnserve.engine.rows import BatchOutput, RowOutput
from attnserve.engine.tokenizer import TokenizedInput
from attnserve.errors import DeadlineExpiredError
from attnserve.server.app import Server
from attnserve.server.batcher import Batcher, BatcherLimits, QueuedInput
from attnserve.server.grpc import calls as calls_module
from attnserve.server.grpc.service import EncoderService
from attnserve.server.metrics import Metrics
from attnserve.server.models import Models, ServedModel
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

# --- the batcher alone ------------------------------------------------------------------------------------------


def item(length: int, marker: int) -> TokenizedInput:
    """An input of `length` tokens whose words are all `marker`: its rows are its own, and the runner sees which
    inputs ran."""
    return TokenizedInput(np.array([101] + [marker] * (length - 2) + [102], dtype=np.int64), False)


def marker(x: QueuedInput) -> int:
    assert isinstance(x, TokenizedInput)
    return int(x.ids[1])


class HeldRunner:
    """Engine.run, recording the markers of each batch's inputs; held, each batch waits for the test's let()."""

    def __init__(self, engine, held: bool = False):
        self.engine, self.held = engine, held
        self.batches: list[list[int]] = []
        self._permits = threading.Semaphore(0)

    def __call__(self, inputs: Sequence[QueuedInput], attention: bool, last_layer: bool = False) -> BatchOutput:
        self.batches.append([marker(x) for x in inputs])
        if self.held:
            assert self._permits.acquire(timeout=30), "the test never let this batch run"
        return self.engine.run(inputs, attention, last_layer)

    def let(self, batches: int = 1) -> None:
        self._permits.release(batches)

    def ran(self, token: int) -> bool:
        return any(token in batch for batch in self.batches)


Scenario = Callable[[Batcher, HeldRunner], Awaitable[Any]]


def serve(engine, scenario: Scenario, held: bool = False, **limits) -> tuple[Any, HeldRunner]:
    """scenario(batcher, runner) in a fresh event loop beside a started batcher; then a request still gets its row
    (the batcher serves on), the queue is empty, and the batcher is drained."""
    runner = HeldRunner(engine, held)
    settings: dict[str, Any] = dict(max_batch_tokens=2048, max_batch_size=256, max_queue_tokens=65536,
                                    max_wait_s=0.002)
    settings.update(limits)

    async def main() -> Any:
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(runner, BatcherLimits(**settings), Metrics().for_model("m"), executor)
            batcher.start()
            try:
                result = await asyncio.wait_for(scenario(batcher, runner), 60)
                runner.held = False
                runner.let(64)  # whatever the scenario left held
                after = item(7, 1999)
                assert_rows([after], await asyncio.wait_for(batcher.submit([after], False, None), 30), engine)
                await asyncio.sleep(0)  # the done callbacks of the last cancels
                assert batcher.queued_tokens == 0
                return result
            finally:
                runner.held = False
                runner.let(64)
                batcher.close()
                await batcher.join()

    return asyncio.run(main()), runner


def assert_rows(inputs: Sequence[TokenizedInput], rows: list[RowOutput], engine) -> None:
    """Each row is its own input's, in order: its sentence embedding is the input's run alone."""
    assert len(rows) == len(inputs)
    for x, row in zip(inputs, rows, strict=True):
        assert row.sentence_embedding is not None
        np.testing.assert_allclose(row.sentence_embedding, engine.run([x]).sentence_embedding[0], atol=1e-4)


def assert_no_errors(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged at error level; futures whose exception nobody read are logged by asyncio once collected."""
    gc.collect()
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.002)


def submit(batcher: Batcher, inputs: Sequence[TokenizedInput], deadline: float | None = None) -> asyncio.Task:
    return asyncio.ensure_future(batcher.submit(inputs, False, deadline))


def cancel_before_next_take(batcher: Batcher, monkeypatch: pytest.MonkeyPatch, tasks: list[asyncio.Task]) -> None:
    """Cancel tasks right before the owner's next _take_batch, in the same loop turn: their futures are cancelled,
    while the done callbacks that take their inputs out of the queue have not run yet."""
    wait_to_fill = batcher._wait_to_fill

    async def then_cancel() -> None:
        await wait_to_fill()
        for task in tasks:
            task.cancel()
        tasks.clear()  # once

    monkeypatch.setattr(batcher, "_wait_to_fill", then_cancel)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.WARNING)
    yield caplog


def test_a_request_cancelled_while_queued_is_dropped_and_the_others_get_their_rows(engine, logs):
    others = [item(n, 1100 + n) for n in (5, 9, 17)]
    victim = item(9, 1150)

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput]]:
        blocker = submit(batcher, [item(6, 1101)])
        await until(lambda: len(runner.batches) == 1)  # running, held: what follows stays queued
        doomed = submit(batcher, [victim])
        answered = [submit(batcher, [x]) for x in others]
        await asyncio.sleep(0.01)
        doomed.cancel()
        runner.held = False
        runner.let()
        await blocker
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return [await task for task in answered]

    rows, runner = serve(engine, scenario, held=True)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert not runner.ran(1150)  # dropped before it cost compute
    assert_no_errors(logs)


@pytest.mark.parametrize("deadline_passed", [False, True], ids=["live", "deadline-passed"])
def test_a_request_cancelled_in_the_same_turn_as_the_take_never_runs(engine, logs, monkeypatch, deadline_passed):
    """The soak's failure: the caller's cancel (its own deadline's wait_for) and the batcher's take in one loop
    turn; with the deadline passed too, the batcher once set DeadlineExpiredError on the cancelled future and
    failed every request queued."""
    others = [item(n, 1200 + n) for n in (5, 11, 30)]
    victim = item(11, 1250)

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput]]:
        blocker = submit(batcher, [item(6, 1201)])
        await until(lambda: len(runner.batches) == 1)
        doomed = submit(batcher, [victim], time.monotonic() + 0.03 if deadline_passed else None)
        answered = [submit(batcher, [x]) for x in others]
        cancel_before_next_take(batcher, monkeypatch, [doomed])
        await asyncio.sleep(0.06)  # past the victim's deadline
        runner.held = False
        runner.let()
        await blocker
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return [await task for task in answered]

    rows, runner = serve(engine, scenario, held=True)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert not runner.ran(1250)
    assert_no_errors(logs)


def test_a_deadline_that_passes_while_queued_fails_its_request_alone(engine, logs):
    """One request's deadline passes while it waits; another's caller times out at the very deadline the batcher
    holds (as the core's own wait_for does): both end, and nothing else does."""
    others = [item(n, 1300 + n) for n in (5, 12, 40)]

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput]]:
        blocker = submit(batcher, [item(6, 1301)])
        await until(lambda: len(runner.batches) == 1)
        soon = time.monotonic() + 0.03
        expired = submit(batcher, [item(8, 1350)], soon)
        timed_out = asyncio.ensure_future(asyncio.wait_for(batcher.submit([item(8, 1351)], False, soon),
                                                           soon - time.monotonic()))
        answered = [submit(batcher, [x]) for x in others]
        await asyncio.sleep(0.06)
        runner.held = False
        runner.let()
        await blocker
        with pytest.raises(DeadlineExpiredError):
            await expired
        with pytest.raises((TimeoutError, asyncio.TimeoutError, DeadlineExpiredError)):
            await timed_out
        return [await task for task in answered]

    rows, runner = serve(engine, scenario, held=True)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert not runner.ran(1350) and not runner.ran(1351)
    assert_no_errors(logs)


def test_a_request_cancelled_while_its_batch_runs_leaves_the_batch_s_other_rows(engine, logs):
    others = [item(n, 1400 + n) for n in (9, 10, 12)]
    victim = item(11, 1450)

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput]]:
        blocker = submit(batcher, [item(6, 1401)])
        await until(lambda: len(runner.batches) == 1)
        doomed = submit(batcher, [victim])
        answered = [submit(batcher, [x]) for x in others]
        await asyncio.sleep(0.01)
        runner.let()  # the blocker; the next batch, all four, is held in the session
        await until(lambda: len(runner.batches) == 2)
        assert sorted(runner.batches[1]) == sorted([1450, *(marker(x) for x in others)])
        doomed.cancel()
        await asyncio.sleep(0.01)
        runner.let()
        await blocker
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return [await task for task in answered]

    rows, _ = serve(engine, scenario, held=True)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert_no_errors(logs)


def test_a_request_cancelled_after_its_rows_are_set(engine, logs, monkeypatch):
    """Cancelled in the turn its batch answered, its rows set but unread: a request of one input ends cancelled; a
    request of two inputs, the first answered, has the second dropped unrun (one input a batch here)."""
    others = [item(n, 1500 + n) for n in (9, 10, 12)]
    first, second, single = item(10, 1550), item(10, 1551), item(10, 1549)

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput]]:
        pair = submit(batcher, [first, second])
        await until(lambda: len(runner.batches) == 1)  # `first`, alone, held
        lone = submit(batcher, [single])
        answered = [submit(batcher, [x]) for x in others]
        cancel_when_answered(batcher, monkeypatch, {1550: pair, 1549: lone})
        await asyncio.sleep(0.01)
        runner.held = False
        runner.let()
        for task in (pair, lone):
            with pytest.raises(asyncio.CancelledError):
                await task
        return [await task for task in answered]

    rows, runner = serve(engine, scenario, held=True, max_batch_size=1)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert runner.ran(1550) and runner.ran(1549) and not runner.ran(1551)
    assert_no_errors(logs)


def cancel_when_answered(batcher: Batcher, monkeypatch: pytest.MonkeyPatch, tasks: dict[int, asyncio.Task]) -> None:
    """Cancel tasks[marker] in the turn the batch holding that marker's input has set its rows."""
    answer = batcher._answer

    def answer_then_cancel(batch: list, out: Any) -> None:
        answer(batch, out)
        for entry in batch:
            task = tasks.pop(marker(entry.input), None)
            if task is not None:
                task.cancel()

    monkeypatch.setattr(batcher, "_answer", answer_then_cancel)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_a_request_admitted_in_parts_ended_midway_leaves_the_others(engine, logs, how):
    """A request of more tokens than the queue holds waits for room between its parts (backpressure); cancelled,
    or its deadline passed, there, its queued part is dropped, and the requests queued beside it are answered."""
    big = [item(20, 1600 + i) for i in range(12)]  # 240 tokens, in parts of 3 inputs (at most half the queue)
    others = [item(20, 1700 + i) for i in range(3)]
    parted = [item(20, 1800 + i) for i in range(7)]

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput]]:
        blocker = submit(batcher, [item(6, 1599)])
        await until(lambda: len(runner.batches) == 1)
        answered = [submit(batcher, [x]) for x in others]
        doomed = submit(batcher, big, time.monotonic() + 0.05 if how == "deadline" else None)
        await asyncio.sleep(0.01)
        assert batcher.queued_tokens == 60 + 60  # the others and its first part; its second waits for room
        if how == "cancel":
            doomed.cancel()
        await asyncio.sleep(0.08)
        assert batcher.queued_tokens == 60
        runner.held = False
        runner.let()
        await blocker
        with pytest.raises(asyncio.CancelledError if how == "cancel" else DeadlineExpiredError):
            await doomed
        rows = [await task for task in answered]
        # A request in parts still answers whole, its rows in order.
        assert_rows(parted, await batcher.submit(parted, False, None), engine)
        return rows

    rows, runner = serve(engine, scenario, held=True, max_queue_tokens=128)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert not any(runner.ran(marker(x)) for x in big)
    assert_no_errors(logs)


def test_random_cancels_and_deadlines_at_any_point_never_touch_another_request(engine, logs):
    """Many small requests, some cancelled and some with deadlines at seeded random moments: every request left
    alone gets its own rows, every other ends as cancelled or expired."""
    rng = random.Random(45)
    inputs = [[item(rng.choice((5, 8, 13, 21, 34)), 2000 + 3 * i + j) for j in range(rng.choice((1, 1, 2, 3)))]
              for i in range(120)]
    fates = [rng.choice(("keep", "keep", "cancel", "deadline")) for _ in inputs]

    async def one(batcher: Batcher, request: list[TokenizedInput], fate: str) -> list[RowOutput] | str:
        await asyncio.sleep(rng.random() * 0.05)
        deadline = time.monotonic() + rng.random() * 0.02 if fate == "deadline" else None
        task = submit(batcher, request, deadline)
        if fate == "cancel":
            await asyncio.sleep(rng.random() * 0.02)
            task.cancel()
        try:
            if deadline is not None:  # the caller times out at the same deadline, as the core does
                return await asyncio.wait_for(task, max(0.0, deadline - time.monotonic()))
            return await task
        except (asyncio.CancelledError, asyncio.TimeoutError, TimeoutError, DeadlineExpiredError):
            return "ended"

    async def scenario(batcher: Batcher, runner: HeldRunner) -> list[list[RowOutput] | str]:
        return list(await asyncio.gather(*(one(batcher, request, fate) for request, fate in zip(
            inputs, fates, strict=True))))

    results, _ = serve(engine, scenario, max_wait_s=0.005, max_batch_tokens=256)
    for request, fate, result in zip(inputs, fates, results, strict=True):
        if fate == "keep":
            assert isinstance(result, list)
            assert_rows(request, result, engine)
    assert_no_errors(logs)


# --- a bounded soak over gRPC ----------------------------------------------------------------------------------

SOAK_SECONDS = 10.0  # new calls stop then; the calls in flight end within a second or two
CALLS_PER_CLIENT = 60
CLIENTS = 4
SHORT = ["The quick brown fox jumps over the lazy dog.", "Kittens drink milk.",
         "Ünïcödé: naïve café, façade, Straße.", "The stock market fell on Monday."]
LONG = " ".join(f"word{i} and more text" for i in range(150))  # past max_seq_length: truncated
BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@asynccontextmanager
async def grpc_server(engine) -> AsyncIterator[Server]:
    """The server's gRPC doors, in this process and loop, over the session's engine, on a loopback port."""
    config = ServerConfig(host="127.0.0.1", port=0, http_port=-1, metrics_port=-1, grace_seconds=5.0)
    metrics = Metrics()
    server = Server(Models([ServedModel("minilm", (), engine, config, metrics)]), config, metrics)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        # The tasks of calls grpc ended may still be unwinding; the loop's end would cancel them.
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            await asyncio.wait(others, timeout=5)


def vectors(reply: pb.EmbedResponse) -> list[np.ndarray]:
    return [np.frombuffer(e.sentence_embedding.data, dtype="<f4") for e in reply.embeddings]


class Client:
    """One soak client: a seeded mix of calls, each reply's status counted, each good reply's rows checked against
    the same inputs embedded alone."""

    def __init__(self, stub: encoder_pb2_grpc.EncoderStub, seed: int, expected: dict[str, np.ndarray],
                 ids: list[int], attention: bool):
        self.stub, self.rng, self.expected, self.ids = stub, random.Random(seed), expected, ids
        self.kinds = ["short", "long", "ids", "tokens", "stream", "bad", "cancel", "deadline", "stream_cancel",
                      "stream_deadline", *(["attention"] if attention else [])]
        self.codes: dict[str, int] = {}
        self.wrong_rows: list[str] = []
        self.bad: list[str] = []  # the calls answered INTERNAL or UNKNOWN: what they were, what they got

    async def run(self, end: float) -> None:
        for _ in range(CALLS_PER_CLIENT):
            if time.monotonic() > end:
                return
            kind = self.rng.choice(self.kinds)
            try:
                await getattr(self, f"_{kind}")()
                self._count(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as error:
                if kind in ("stream_deadline", "stream_cancel") and own_write_failed(error):
                    self.codes["own write failed"] = self.codes.get("own write failed", 0) + 1
                    continue
                self._count(error.code())
                if error.code() in BAD_CODES:
                    self.bad.append(f"{kind}: {error.code().name} {error.details()} [{error.debug_error_string()}]")
            except asyncio.CancelledError:  # a call this client cancelled
                self._count(grpc.StatusCode.CANCELLED)

    def _count(self, code: grpc.StatusCode) -> None:
        self.codes[code.name] = self.codes.get(code.name, 0) + 1

    def _texts(self, n: int) -> list[str]:
        return self.rng.sample(SHORT, n)

    def _check(self, texts: list[str], reply: pb.EmbedResponse) -> None:
        for text, got in zip(texts, vectors(reply), strict=True):
            want = self.expected[text]
            if float(got @ want) < 0.999:  # both normalised
                self.wrong_rows.append(text)

    async def _short(self) -> None:
        texts = self._texts(self.rng.choice((1, 2, 3)))
        self._check(texts, await self.stub.Embed(embed(texts), timeout=30))

    async def _long(self) -> None:
        self._check([LONG], await self.stub.Embed(embed([LONG]), timeout=30))

    async def _ids(self) -> None:
        reply = await self.stub.Embed(pb.EmbedRequest(inputs=[pb.Input(token_ids=pb.TokenIds(ids=self.ids))]),
                                      timeout=30)
        self._check([SHORT[0]], reply)  # the ids are SHORT[0]'s

    async def _tokens(self) -> None:
        texts = self._texts(1)
        request = embed(texts)
        request.return_token_embeddings = True
        reply = await self.stub.Embed(request, timeout=30)
        self._check(texts, reply)
        assert reply.embeddings[0].token_embeddings.shape[0] == reply.embeddings[0].num_tokens

    async def _attention(self) -> None:
        texts = self._texts(1)
        request = embed(texts)
        request.attention.CopyFrom(pb.AttentionOptions(layers=[-1], average_heads=True))
        reply = await self.stub.Embed(request, timeout=30)
        self._check(texts, reply)
        assert reply.embeddings[0].attentions.data

    def _stream_requests(self) -> list[tuple[list[str], pb.EmbedRequest]]:
        texts = [self._texts(1) for _ in range(self.rng.choice((2, 3, 5)))]
        return [(t, embed(t)) for t in texts]

    async def _stream(self) -> None:
        requests = self._stream_requests()
        replies = [reply async for reply in self.stub.EmbedStream(iter(r for _, r in requests), timeout=30)]
        for (texts, _), reply in zip(requests, replies, strict=True):
            self._check(texts, reply)

    async def _bad(self) -> None:
        request = self.rng.choice([
            pb.EmbedRequest(),  # no inputs
            pb.EmbedRequest(inputs=[pb.Input(text="hi")], model="no-such-model"),
            pb.EmbedRequest(inputs=[pb.Input(token_ids=pb.TokenIds(ids=[101, 10**9, 102]))]),
            pb.EmbedRequest(inputs=[pb.Input(text="hi")], dimensions=100000),
            pb.EmbedRequest(inputs=[pb.Input(text=LONG)], truncate=False),
        ])
        await self.stub.Embed(request, timeout=30)

    async def _cancel(self) -> None:
        call = self.stub.Embed(embed(self._texts(2) + [LONG]), timeout=30)
        await asyncio.sleep(self.rng.random() * 0.03)
        call.cancel()
        await call

    async def _deadline(self) -> None:
        await self.stub.Embed(embed([*self._texts(2), LONG]), timeout=0.001 + self.rng.random() * 0.04)

    async def _stream_cancel(self) -> None:
        call = self.stub.EmbedStream(iter([embed(t) for t, _ in self._stream_requests()]), timeout=30)
        async for _ in call:
            call.cancel()

    async def _stream_deadline(self) -> None:
        requests = [embed([LONG]) for _ in range(3)]
        async for _ in self.stub.EmbedStream(iter(requests), timeout=0.005 + self.rng.random() * 0.05):
            pass


def own_write_failed(error: grpc.aio.AioRpcError) -> bool:
    """The status grpc's aio client gives a stream call itself when writing one of its requests fails, the call
    having ended meanwhile (its deadline passed while the client still wrote): INTERNAL "Internal error from Core"
    (grpc/aio/_call.py _write, set_internal_error), whatever the server sent or did. No server answered it. It comes
    too when the client cancelled its own stream while its writer still wrote (grpc/grpc#36066, the fix in #43486).
    The write's error names the failed operation in either of two forms, by where in the core the batch failed:
    'Failed "send_message"' or 'Failed "execute_batch": (<...SendMessageOperation object ...>,)'."""
    where = error.debug_error_string() or ""
    return (error.code() == grpc.StatusCode.INTERNAL and error.details() == "Internal error from Core"
            and ("send_message" in where or "SendMessageOperation" in where))


def embed(texts: list[str]) -> pb.EmbedRequest:
    return pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts])


LATE = "late"  # a text whose request the patched service answers only after the call's deadline


@pytest.fixture
def late_answers(monkeypatch: pytest.MonkeyPatch) -> list[grpc.StatusCode]:
    """EncoderService answers a request for LATE past its call's deadline with DeadlineExpiredError, the loop blocked
    meanwhile (time.sleep), so that grpc, whose core ends the call at its deadline, cannot cancel the handler
    first: the race the soak met, made certain. Returns the codes the call was aborted with (abort spied on)."""
    real_embed, real_abort = EncoderService._embed, calls_module.abort
    aborted: list[grpc.StatusCode] = []

    async def embed_late(self: EncoderService, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
                         ) -> tuple[bytes, int]:
        if any(x.text == LATE for x in request.inputs):
            remaining = context.time_remaining()
            time.sleep((remaining or 0.0) + 0.1)
            raise DeadlineExpiredError("the request's deadline passed before it was answered")
        return await real_embed(self, request, context)

    async def spied_abort(context: grpc.aio.ServicerContext, status: grpc.Status) -> Any:
        aborted.append(status.code)
        return await real_abort(context, status)

    monkeypatch.setattr(EncoderService, "_embed", embed_late)
    monkeypatch.setattr(calls_module, "abort", spied_abort)
    return aborted


@pytest.mark.parametrize("method", ["Embed", "EmbedStream"])
def test_a_call_its_deadline_ended_is_not_aborted_and_logs_nothing(engine, logs, late_answers, method):
    async def scenario() -> tuple[grpc.StatusCode, pb.EmbedResponse]:
        async with grpc_server(engine) as server, grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = encoder_pb2_grpc.EncoderStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                if method == "Embed":
                    await stub.Embed(embed([LATE]), timeout=0.05)
                else:
                    async for _ in stub.EmbedStream(iter([embed(SHORT[:1]), embed([LATE])]), timeout=0.5):
                        pass
            await asyncio.sleep(0.3)  # the handler has ended
            return ended.value.code(), await stub.Embed(embed(SHORT[:1]), timeout=30)

    code, after = asyncio.run(scenario())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert late_answers == []  # a call grpc ended takes no status
    assert len(after.embeddings) == 1
    assert_no_errors(logs)


def test_a_status_grpc_refuses_to_send_ends_the_call_as_cancelled(engine, logs, monkeypatch):
    """The call ends between the look at it and the status's write: grpc's core refuses the write (ExecuteBatchError,
    raised here in abort's place), and the call ends as a cancelled one, logged at debug, nothing at error."""
    from grpc._cython.cygrpc import ExecuteBatchError

    refused: list[grpc.StatusCode] = []

    async def refusing_abort(context: grpc.aio.ServicerContext, status: grpc.Status) -> Any:
        refused.append(status.code)
        raise ExecuteBatchError('Failed "execute_batch"')

    monkeypatch.setattr(calls_module, "abort", refusing_abort)

    async def scenario() -> grpc.StatusCode:
        async with grpc_server(engine) as server, grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = encoder_pb2_grpc.EncoderStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await stub.Embed(pb.EmbedRequest(), timeout=0.3)  # no inputs: INVALID_ARGUMENT, never sent
            return ended.value.code()

    assert asyncio.run(scenario()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert refused == [grpc.StatusCode.INVALID_ARGUMENT]
    assert_no_errors(logs)


def test_a_soak_of_mixed_calls_cancels_and_deadlines_gets_no_internal_error_and_logs_none(engine, logs):
    async def soak() -> tuple[list[Client], pb.EmbedResponse]:
        async with grpc_server(engine) as server, grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = encoder_pb2_grpc.EncoderStub(channel)
            attention = "attention" in (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)).outputs
            # Each input embedded alone first: the rows the soak's replies must hold.
            expected = {text: vectors(await stub.Embed(embed([text]), timeout=30))[0] for text in [*SHORT, LONG]}
            ids = [int(i) for i in engine.tokenizer.encode_texts([SHORT[0]])[0].ids]
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") for _ in range(CLIENTS)]
            clients = [Client(encoder_pb2_grpc.EncoderStub(c), seed, expected, ids, attention)
                       for seed, c in enumerate(channels)]
            try:
                await asyncio.gather(*(client.run(time.monotonic() + SOAK_SECONDS) for client in clients))
            finally:
                for c in channels:
                    await c.close()
            after = await stub.Embed(embed(SHORT), timeout=30)  # the server serves on
            assert server.models.default.batcher.queued_tokens == 0
            return clients, after

    clients, after = asyncio.run(soak())
    codes: dict[str, int] = {}
    for client in clients:
        for code, n in client.codes.items():
            codes[code] = codes.get(code, 0) + n
    assert not [bad for client in clients for bad in client.bad], codes
    assert codes.get("OK", 0) >= 20 and codes.get("CANCELLED", 0) and codes.get("DEADLINE_EXCEEDED", 0), codes
    assert sum(codes.values()) <= CLIENTS * CALLS_PER_CLIENT
    assert not [text for client in clients for text in client.wrong_rows]
    assert len(after.embeddings) == len(SHORT)
    assert_no_errors(logs)
