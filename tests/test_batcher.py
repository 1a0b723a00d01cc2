"""The batcher around the real engine: what it batches, drops and refuses; cancels and deadlines raced against it
at every point of a request's life (a batcher step wrapped to cancel at one exact point, batches held in the session);
and a bounded soak of the gRPC door in this process, which once got INTERNAL on every kind of call: a cancelled input
still queued passed its deadline, and the exception set on its cancelled future failed the whole queue."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import grpc
import numpy as np
import pytest

from attnserve.config import ServerConfig
from attnserve.engine.batching import BATCH_OVERHEAD_CELLS, plan_batches
from attnserve.engine.rows import RowOutput
from attnserve.engine.tokenizer import TokenizedInput
from attnserve.errors import BatchFailedError, DeadlineExpiredError, QueueFullError, ShuttingDownError
from attnserve.server.app import Server
from attnserve.server.batch_pairs import BatchPairs
from attnserve.server.batch_wait import BatchWait
from attnserve.server.batcher import Batcher, BatcherLimits
from attnserve.server.grpc import calls as calls_module
from attnserve.server.grpc.service import EncoderService
from attnserve.server.metrics import Metrics
from attnserve.server.models import Models, ServedModel
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

POISON = 4242  # a token id that makes the runner's batch fail


def item(length: int, marker: int = 1000) -> TokenizedInput:
    """An input of `length` tokens whose words are all `marker`: its rows are its own, and the runner sees it run."""
    return TokenizedInput(np.array([101] + [marker] * (length - 2) + [102], dtype=np.int64), False)


def markers(inputs: Sequence[Any]) -> list[int]:
    return [int(x.ids[1]) for x in inputs]


class Runner:
    """Engine.run, recording each batch's inputs; held, each batch waits for the test's let(); a batch holding
    POISON fails as a broken session would."""

    def __init__(self, engine, held: bool = False):
        self.engine, self.held, self.batches, self.token_states = engine, held, [], []
        self.widths: list[bool] = []  # each batch's narrow (half width: server/batch_pairs.py)
        self.running: list[bool] = []  # the widths of the batches running now
        self.overlaps: list[list[bool]] = []  # at each batch's start, the widths running beside it
        self._permits = threading.Semaphore(0)
        self._lock = threading.Lock()

    def __call__(self, inputs, attention, last_layer=False, token_states=True, narrow=False):
        with self._lock:
            self.batches.append(list(inputs))
            self.token_states.append(token_states)
            self.widths.append(narrow)
            self.overlaps.append(list(self.running))
            self.running.append(narrow)
        try:
            if self.held:
                assert self._permits.acquire(timeout=30), "the test never let this batch run"
            if any(POISON in x.ids for x in inputs):
                raise RuntimeError("simulated onnxruntime failure")
            return self.engine.run(inputs, attention, last_layer, token_states, narrow)
        finally:
            with self._lock:
                self.running.remove(narrow)

    def let(self, batches: int = 1) -> None:
        self._permits.release(batches)

    def release(self) -> None:
        self.held = False
        self.let(64)

    def ran(self, marker: int) -> bool:
        return any(marker in markers(batch) for batch in self.batches)


def serve(engine, scenario, held: bool = False, serves_on: bool = True, **limits):
    """scenario(batcher, runner) in a fresh event loop beside a started batcher; then (serves_on) a request of 7
    inputs still gets its rows (in parts where the queue is small) and the queue is empty."""
    runner = Runner(engine, held)
    settings = dict(max_batch_tokens=2048, max_batch_size=256, max_queue_tokens=65536, max_wait_s=0.002) | limits

    async def main():
        paired = settings.pop("pairs", False)  # --pair-batches: the half-width batches' own two threads
        with ThreadPoolExecutor(1 if paired else settings.get("in_flight", 1)) as executor, \
                ThreadPoolExecutor(2) as halves:
            batcher = Batcher(runner, BatcherLimits(**settings), Metrics().for_model("m"), executor,
                              BatchPairs(halves) if paired else None)
            batcher.start()
            try:
                result = await asyncio.wait_for(scenario(batcher, runner), 60)
                if serves_on:
                    runner.release()
                    after = [item(20, 1900 + i) for i in range(7)]
                    assert_rows(after, await asyncio.wait_for(batcher.submit(after, False, None), 30), engine)
                    await asyncio.sleep(0)  # the done callbacks of the last cancels
                    assert batcher.queued_tokens == 0
                return result
            finally:
                runner.release()
                batcher.close()
                await batcher.join()

    return asyncio.run(main()), runner


def assert_rows(inputs: Sequence[TokenizedInput], rows: list[RowOutput], engine, atol: float = 1e-4) -> None:
    """Each row is its own input's, in order: its sentence embedding is the input's run alone."""
    assert len(rows) == len(inputs)
    for x, row in zip(inputs, rows, strict=True):
        np.testing.assert_allclose(row.sentence_embedding, engine.run([x]).sentence_embedding[0], atol=atol)


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


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING)
    return caplog


# --- what it batches, drops and refuses -------------------------------------------------------------------------


def test_rows_come_back_in_request_order_and_equal_a_lone_run(engine):
    inputs = [item(n) for n in (5, 200, 17, 64, 3, 128)]
    rows, _ = serve(engine, lambda batcher, runner: batcher.submit(inputs, attention=False, deadline=None))
    assert [row.token_embeddings.shape for row in rows] == [(len(x), 384) for x in inputs]
    assert_rows(inputs, rows, engine, atol=1e-5)


def test_a_batch_fetches_token_states_only_where_one_of_its_requests_needs_them(engine):
    """A batch of plain embeddings runs without the (B, T, H) states (on a GPU, no copy of them to the host); one
    that holds a request for token embeddings fetches them, and each row gets what its own request asked."""
    plain, wanting = [item(n, 1100 + n) for n in (5, 40, 9)], [item(n, 1200 + n) for n in (7, 33)]

    async def scenario(batcher, runner):
        alone = asyncio.ensure_future(batcher.submit(plain, False, None, token_states=False))
        await until(lambda: len(runner.batches) == 1)
        runner.let()
        alone = await alone
        blocker = asyncio.ensure_future(batcher.submit([item(3, 1300)], False, None, token_states=False))
        await until(lambda: len(runner.batches) == 2)  # held in the session: the next two requests queue together
        first = asyncio.ensure_future(batcher.submit(plain, False, None, token_states=False))
        second = asyncio.ensure_future(batcher.submit(wanting, False, None))
        await until(lambda: batcher.queued_tokens == sum(len(x) for x in [*plain, *wanting]))
        runner.release()
        await blocker
        return alone, await first, await second

    (alone, first, second), runner = serve(engine, scenario, held=True, max_wait_s=0.0)
    assert runner.token_states[:2] == [False, False]  # the plain request alone; the blocker
    # The batches of the two requests (markers 11xx: plain's, 12xx: wanting's), not serve()'s own request after them.
    later = [(set(m // 100 for m in markers(batch)), states)
             for batch, states in zip(runner.batches[2:], runner.token_states[2:], strict=True)]
    ours = [(requests, states) for requests, states in later if requests & {11, 12}]
    assert {11, 12} in [requests for requests, _ in ours]  # the two requests shared a batch
    assert all(states == (12 in requests) for requests, states in ours)
    assert all(row.token_embeddings is None for row in [*alone, *first])
    assert [row.token_embeddings.shape for row in second] == [(len(x), 384) for x in wanting]
    assert_rows(plain, alone, engine, atol=1e-5)
    assert_rows(plain, first, engine, atol=1e-5)
    assert_rows(wanting, second, engine, atol=1e-5)


def test_batches_in_flight_run_side_by_side_and_answer_each_their_own_rows(engine):
    """--batches-in-flight 2: a second batch starts while the first is held in the session, every row is the
    input's own, and the drain waits for both."""
    inputs = [item(n, 1000 + n) for n in (5, 9, 40, 120, 7, 64, 33, 250)]

    async def scenario(batcher, runner):
        first = submit(batcher, inputs[:1])
        await until(lambda: len(runner.batches) == 1)
        rest = [submit(batcher, [x]) for x in inputs[1:]]
        await until(lambda: len(runner.batches) == 2)  # two batches in flight at once
        runner.release()
        return [*(await first), *[row for r in await asyncio.gather(*rest) for row in r]]

    rows, _ = serve(engine, scenario, held=True, max_batch_tokens=256, max_wait_s=0.0, in_flight=2)
    assert_rows(inputs, rows, engine, atol=1e-5)


def test_paired_batches_run_alone_at_full_width_and_two_at_half_width_under_load(engine):
    """--pair-batches: a lone request runs on the full session; while a batch runs and more are queued, batches run
    on the half-width session, two at once; nothing runs beside a full-width batch, an attention batch (its own
    graph, every core) waits for the half-width ones to end; every row is its input's own."""
    engine.open_narrow_session()
    inputs = [item(n, 1000 + n) for n in (5, 9, 40, 120, 7, 64, 33, 250)]

    async def scenario(batcher, runner):
        lone = submit(batcher, [item(12, 1500)])
        await until(lambda: len(runner.batches) == 1)
        runner.let()
        lone = await lone
        first = submit(batcher, inputs[:1])
        await until(lambda: len(runner.batches) == 2)  # alone, nothing queued: full width
        rest = [submit(batcher, [x]) for x in inputs[1:]]
        await until(lambda: batcher.queued_tokens == sum(len(x) for x in inputs[1:]))
        await asyncio.sleep(0.05)
        assert len(runner.batches) == 2  # nothing starts beside a full-width batch
        runner.let()
        await until(lambda: len(runner.batches) == 4)  # the queue's first two batches, at half width, at once
        assert runner.widths[2:4] == [True, True] and runner.overlaps[3] == [True]
        attention = asyncio.ensure_future(batcher.submit([item(9, 1600)], True, None))
        runner.release()
        return lone, await first, [row for r in await asyncio.gather(*rest) for row in r], await attention

    (lone, first, rest, attention), runner = serve(engine, scenario, held=True, max_batch_tokens=256,
                                                   max_wait_s=0.0, in_flight=2, pairs=True)
    assert runner.widths[:2] == [False, False] and runner.overlaps[:2] == [[], []]
    for narrow, beside in zip(runner.widths, runner.overlaps, strict=True):
        assert len(beside) <= 1 and (narrow and beside in ([], [True]) or not narrow and beside == [])
    attention_batch = next(i for i, batch in enumerate(runner.batches) if 1600 in markers(batch))
    assert runner.widths[attention_batch] is False and runner.overlaps[attention_batch] == []
    assert_rows([item(12, 1500)], lone, engine, atol=1e-5)
    assert_rows(inputs, [*first, *rest], engine, atol=1e-5)
    np.testing.assert_allclose(attention[0].sentence_embedding, engine.run([item(9, 1600)]).sentence_embedding[0],
                               atol=1e-5)


def test_the_half_width_session_gives_the_full_one_s_rows(engine):
    engine.open_narrow_session()
    inputs = [item(n, 1000 + n) for n in (3, 17, 64, 200)]
    full, half = engine.run(inputs), engine.run(inputs, narrow=True)
    np.testing.assert_allclose(half.sentence_embedding, full.sentence_embedding, atol=1e-5)
    np.testing.assert_allclose(half.last_hidden_state, full.last_hidden_state, atol=1e-5)


def test_concurrent_requests_are_batched_by_length(engine):
    lengths = np.random.default_rng(0).choice([6, 7, 8, 30, 31, 32, 120, 128], size=64)

    async def scenario(batcher, runner):
        await asyncio.gather(*(batcher.submit([item(int(n))], False, None) for n in lengths))
        return [[len(x) for x in batch] for batch in runner.batches]

    batches, _ = serve(engine, scenario, max_wait_s=0.05)
    assert sum(map(len, batches)) == 64 and len(batches) < 16  # batched, not one by one
    cells = sum(max(b) * len(b) for b in batches)
    assert 1 - lengths.sum() / cells <= 0.05  # similar lengths went together
    assert all(max(b) * len(b) <= 2048 and len(b) <= 256 for b in batches)


def test_a_full_queue_does_not_wait_and_a_small_one_waits_at_most_max_wait_under_load(engine):
    async def scenario(batcher, runner):
        start = time.monotonic()
        await batcher.submit([item(16)] * 4, False, None)  # 64 tokens: a full batch
        full = time.monotonic() - start
        for _ in range(3):  # bursts of 8 clients at once: the server is under load
            await asyncio.gather(*(batcher.submit([item(8)], False, None) for _ in range(8)))
        assert batcher.wait.under_load
        start = time.monotonic()
        await batcher.submit([item(8)], False, None)
        return full, time.monotonic() - start

    # A wait of 1 s, against which a loaded 2-core machine's delays (0.32 s seen for the full batch) stay small.
    (full, small), _ = serve(engine, scenario, serves_on=False, max_wait_s=1.0, max_batch_tokens=64)
    assert full < 0.5 and 1.0 <= small < 3.0


def test_an_idle_server_runs_a_lone_request_at_once(engine):
    async def scenario(batcher, runner):
        waits = []
        for _ in range(5):  # one client at a time: nothing would ever arrive during a wait
            start = time.monotonic()
            await batcher.submit([item(8)], False, None)
            waits.append(time.monotonic() - start)
        return waits, batcher.wait.under_load, [len(b) for b in runner.batches]

    (waits, under_load, sizes), _ = serve(engine, scenario, max_wait_s=0.5)
    assert not under_load and max(waits) < 0.25  # far under the 0.5 s max_wait
    assert sizes == [1] * 5


def test_the_wait_follows_the_load_within_a_few_batches():
    wait = BatchWait(max_wait_s=0.002)
    assert wait.wait_s() == 0.0  # a new server is idle
    for _ in range(5):  # one request per batch: a lone client
        wait.arrived()
        wait.batch_started()
    assert wait.wait_s() == 0.0
    for _ in range(64):  # 64 clients' requests arrive while a batch runs
        wait.arrived()
    wait.batch_started()
    assert wait.wait_s() == 0.002
    for _ in range(3):  # a backlog drains: batches with no new arrivals do not end the load at once
        wait.batch_started()
    assert wait.wait_s() == 0.002
    batches_to_idle = 0
    while wait.under_load:  # the load is gone: one request per batch again
        wait.arrived()
        wait.batch_started()
        batches_to_idle += 1
    assert 1 <= batches_to_idle <= 8


def test_a_failed_batch_fails_only_its_callers(engine):
    async def scenario(batcher, runner):
        poisoned = batcher.submit([item(5, POISON)], False, None)
        other_length = batcher.submit([item(250)], False, None)  # planned into a batch of its own
        other_graph = batcher.submit([item(5)], True, None)  # the attention graph: another batch
        return await asyncio.gather(poisoned, other_length, other_graph, return_exceptions=True)

    results, _ = serve(engine, scenario, max_wait_s=0.05)  # and serves on
    assert isinstance(results[0], BatchFailedError) and "retry" in str(results[0])
    assert results[1][0].sentence_embedding.shape == (384,)
    assert results[2][0].attentions.shape == (6, 12, 5, 5)


def test_queue_full_is_refused_at_once_and_close_refuses_new_work(engine):
    async def scenario(batcher, runner):
        running = submit(batcher, [item(256)] * 4)  # taken into the batch, held
        await until(lambda: len(runner.batches) == 1)
        queued = submit(batcher, [item(200)] * 4)  # 800 of 1024 tokens
        await asyncio.sleep(0.01)
        submitted = batcher.submit([item(300)], False, None)
        with pytest.raises(QueueFullError, match="queue full: 800 of 1024 tokens waiting"):
            submitted.send(None)  # refused in its first step: it never waits on the queue (no clock to read)
        fits = submit(batcher, [item(200)])  # 1000 of 1024: accepted
        await asyncio.sleep(0)  # let it enter the queue
        batcher.close()
        with pytest.raises(ShuttingDownError):
            await batcher.submit([item(5)], False, None)
        runner.release()
        return [len(r) for r in await asyncio.gather(running, queued, fits)]

    answered, _ = serve(engine, scenario, held=True, serves_on=False, max_queue_tokens=1024)
    assert answered == [4, 4, 1]  # everything accepted is answered, even after close


def test_a_request_admitted_in_parts_leaves_half_the_queue_to_the_others(engine):
    """A request of more tokens than the queue holds queues a later part only while the queue stays at most half
    full with it: a short request sent between its parts is admitted (a CI run once got 429 for a LangChain query
    sent beside 1,000 texts, the parts having filled the queue), and both are answered whole."""
    async def scenario(batcher, runner):
        blocker = submit(batcher, [item(6, 1001)])
        await until(lambda: len(runner.batches) == 1)  # running, held: what follows stays queued
        big = [item(20, 1600 + i) for i in range(12)]  # 240 tokens in a 128-token queue: parts of 3 inputs
        whole = submit(batcher, big)
        await asyncio.sleep(0.01)
        assert batcher.queued_tokens == 60  # its first part; the second would make the queue more than half full
        short = [item(60, 1700)]
        meanwhile = submit(batcher, short)
        await asyncio.sleep(0)
        assert batcher.queued_tokens == 120  # admitted beside the first part
        runner.release()
        await blocker
        return big, await whole, short, await meanwhile

    (big, big_rows, short, short_rows), runner = serve(engine, scenario, held=True, max_queue_tokens=128)
    assert_rows(big, big_rows, engine)
    assert_rows(short, short_rows, engine)
    assert all(sum(len(x) for x in batch) <= 128 for batch in runner.batches)


def test_a_batcher_bug_fails_the_queued_requests_instead_of_hanging(engine, monkeypatch):
    import attnserve.server.batcher as batcher_module

    calls = []

    def planner_with_a_bug(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a planner bug")
        return plan_batches(*args, **kwargs)

    monkeypatch.setattr(batcher_module, "plan_batches", planner_with_a_bug)

    async def scenario(batcher, runner):
        with pytest.raises(BatchFailedError, match="batcher failed"):
            await asyncio.wait_for(batcher.submit([item(8)], False, None), 10)

    serve(engine, scenario)  # the owner lives on


def test_a_time_bound_refuses_by_the_work_queued_ahead_not_the_request_size(engine):
    async def scenario(batcher, runner):
        batcher.learn_rate(False, seconds=0.5, tokens=1000, cells=2048)  # 0.5 ms a token, as warm-up would seed
        running = submit(batcher, [item(8)])  # held in the session, so that what follows stays queued
        await until(lambda: len(runner.batches) == 1)
        # An empty queue takes any request, however long it will run: 8 x 200 tokens ~ 0.8 s > the 0.5 s bound.
        big = submit(batcher, [item(200)] * 8)
        await asyncio.sleep(0.01)
        assert batcher.queued_seconds == pytest.approx(0.8)
        with pytest.raises(QueueFullError, match="about 800 ms of work waiting, more than the server's limit of 500"):
            batcher.check_room(1)  # what the service asks before it tokenizes anything
        submitted = batcher.submit([item(5)], False, None)
        with pytest.raises(QueueFullError, match="about 800 ms"):
            submitted.send(None)  # refused in its first step: it never waits on the queue (no clock to read)
        runner.release()
        return [len(r) for r in await asyncio.gather(running, big)]

    answered, _ = serve(engine, scenario, held=True, max_queue_wait_s=0.5)
    assert answered == [1, 8]


def test_the_speed_estimate_follows_full_batches_only():
    batcher = Batcher(lambda *a: None, BatcherLimits(2048, 256, 65536, 0.002, 1.0), Metrics().for_model("m"), None)
    batcher.learn_rate(False, seconds=0.2, tokens=2000, cells=2048)  # the warm-up seed: 0.1 ms a token
    batcher.learn_rate(False, seconds=0.01, tokens=10, cells=10)  # a lone short input: 1 ms a token, ignored
    batcher._lane_tokens[(False, False)] = 1000
    assert batcher.queued_seconds == pytest.approx(0.1)
    batcher.learn_rate(False, seconds=0.4, tokens=2000, cells=2048)  # the machine got slower: 0.2 ms a token
    assert batcher.queued_seconds == pytest.approx(0.1 + 0.2 * 0.1)


def test_plans_of_alike_lengths_stay_optimal():
    """plan_batches' shortcut (alike lengths that fit one batch are one batch) and its starts (_boundaries) are
    exactly as cheap as an exhaustive search, over random queues of alike and of mixed lengths, at the CPU's run
    cost and a GPU's."""
    def best(lengths, budget, size_cap, run_cells):
        s = sorted(lengths.tolist(), reverse=True)
        costs = [0.0] + [float("inf")] * len(s)
        for j in range(1, len(s) + 1):
            for i in range(j):
                if j - i <= size_cap and (j - i == 1 or s[i] * (j - i) <= budget):
                    costs[j] = min(costs[j], costs[i] + s[i] * (j - i) + run_cells)
        return costs[-1]

    rng = np.random.default_rng(0)
    # 500 short queues, and 40 long ones of repeated lengths (a long queue's, an offline chunk's), where the plan
    # considers only the starts batching.py's _boundaries keeps: each run's first input, and full batches' starts.
    for n in [int(n) for n in rng.integers(1, 30, 500)] + [int(n) for n in rng.integers(100, 400, 40)]:
        base, spread = int(rng.integers(1, 200)), int(rng.choice([1, 3, 8, 150]))
        lengths = base + rng.integers(0, spread, n)
        budget, size_cap = int(rng.choice([256, 512, 2048])), int(rng.choice([4, 16, 256]))
        run_cells = int(rng.choice([BATCH_OVERHEAD_CELLS, 1024]))
        plan = plan_batches(lengths, budget, size_cap, run_cells)
        assert sorted(np.concatenate(plan).tolist()) == list(range(n))
        assert sum(int(lengths[p].max()) * len(p) + run_cells for p in plan) == best(lengths, budget, size_cap,
                                                                                     run_cells)


# --- cancels and deadlines raced against it ---------------------------------------------------------------------
# Each race runs while a batch is held in the session, so that what it submits stays queued until it returns:
# race(batcher, runner, monkeypatch, others) submits `others` (each its own request) and a victim, ends the victim,
# and returns the others' tasks and {each ended task: the error it ends with}.


def submit_each(batcher: Batcher, inputs: Sequence[TokenizedInput]) -> list[asyncio.Task]:
    return [submit(batcher, [x]) for x in inputs]


async def cancelled_while_queued(batcher, runner, monkeypatch, others):
    doomed = submit(batcher, [item(9, 1150), item(30, 1151)])
    answered = submit_each(batcher, others)
    await asyncio.sleep(0.01)
    doomed.cancel()
    await asyncio.sleep(0.01)
    assert batcher.queued_tokens == 60  # the others' alone: dropped before it cost compute
    return answered, {doomed: asyncio.CancelledError}


def cancelled_in_the_same_turn_as_the_take(deadline_passed: bool):
    """The soak's failure: the caller's cancel (its own deadline's wait_for) and the batcher's take in one loop
    turn; with the deadline passed too, the batcher once set DeadlineExpiredError on the cancelled future."""
    async def race(batcher, runner, monkeypatch, others):
        doomed = submit(batcher, [item(11, 1250)], time.monotonic() + 0.03 if deadline_passed else None)
        answered = submit_each(batcher, others)
        wait_to_fill = batcher._wait_to_fill

        async def then_cancel() -> None:  # its future cancelled, its task not yet resumed to take it out
            await wait_to_fill()
            if not doomed.done():
                doomed.cancel()

        monkeypatch.setattr(batcher, "_wait_to_fill", then_cancel)
        await asyncio.sleep(0.06)  # past the victim's deadline
        return answered, {doomed: asyncio.CancelledError}
    return race


async def deadline_passed_while_queued(batcher, runner, monkeypatch, others):
    """One deadline passes while queued; another caller times out at the very deadline the batcher holds (as the
    core's own wait_for does); a third had passed before it was queued."""
    with pytest.raises(DeadlineExpiredError, match="before the request was queued"):
        await batcher.submit([item(8, 1352)], False, time.monotonic() - 1)
    soon = time.monotonic() + 0.03
    expired = submit(batcher, [item(8, 1350)], soon)
    timed_out = asyncio.ensure_future(asyncio.wait_for(batcher.submit([item(8, 1351)], False, soon),
                                                       soon - time.monotonic()))
    answered = submit_each(batcher, others)
    await asyncio.sleep(0.06)
    return answered, {expired: DeadlineExpiredError,
                      timed_out: (TimeoutError, asyncio.TimeoutError, DeadlineExpiredError)}


async def cancelled_while_its_batch_runs(batcher, runner, monkeypatch, others):
    doomed = submit(batcher, [item(11, 1450)])
    answered = submit_each(batcher, others)
    await asyncio.sleep(0.01)
    runner.let()  # the blocker; the next batch, all four, is held in the session
    await until(lambda: len(runner.batches) == 2)
    assert sorted(markers(runner.batches[1])) == sorted([1450, *markers(others)])
    doomed.cancel()
    await asyncio.sleep(0.01)
    return answered, {doomed: asyncio.CancelledError}


async def cancelled_once_its_rows_are_set(batcher, runner, monkeypatch, others):
    """Cancelled in the turn its batch answered (one input a batch here), its rows set but unread: a request of one
    input ends cancelled; one of two inputs, the first answered, has the second dropped unrun."""
    pair, lone = submit(batcher, [item(10, 1550), item(10, 1551)]), submit(batcher, [item(10, 1549)])
    answered = submit_each(batcher, others)
    tasks, answer = {1550: pair, 1549: lone}, batcher._answer

    def answer_then_cancel(batch: list, out: Any) -> None:
        answer(batch, out)
        for entry in batch:
            if (task := tasks.pop(markers([entry.input])[0], None)) is not None:
                task.cancel()

    monkeypatch.setattr(batcher, "_answer", answer_then_cancel)
    await asyncio.sleep(0.01)
    return answered, {pair: asyncio.CancelledError, lone: asyncio.CancelledError}


def ended_between_its_parts(how: str):
    """A request of more tokens than the queue holds waits for room between its parts (backpressure); cancelled, or
    its deadline passed, there, its queued part is dropped."""
    async def race(batcher, runner, monkeypatch, others):
        answered = submit_each(batcher, others)
        big = [item(20, 1600 + i) for i in range(12)]  # 240 tokens, in parts of 3 inputs (at most half the queue)
        doomed = submit(batcher, big, time.monotonic() + 0.05 if how == "deadline" else None)
        await asyncio.sleep(0.01)
        assert batcher.queued_tokens == 60 + 60  # the others and its first part; its second waits for room
        if how == "cancel":
            doomed.cancel()
        await asyncio.sleep(0.08)
        assert batcher.queued_tokens == 60
        return answered, {doomed: asyncio.CancelledError if how == "cancel" else DeadlineExpiredError}
    return race


RACES = {  # id: (race, batcher limits, markers that must run, markers that must not)
    "cancelled-while-queued": (cancelled_while_queued, {}, [], [1150, 1151]),
    "cancelled-at-the-take": (cancelled_in_the_same_turn_as_the_take(False), {}, [], [1250]),
    "cancelled-at-the-take-deadline-passed": (cancelled_in_the_same_turn_as_the_take(True), {}, [], [1250]),
    "deadline-passed-while-queued": (deadline_passed_while_queued, {}, [], [1350, 1351, 1352]),
    "cancelled-while-its-batch-runs": (cancelled_while_its_batch_runs, {}, [1450], []),
    "cancelled-once-its-rows-are-set": (cancelled_once_its_rows_are_set, {"max_batch_size": 1}, [1550, 1549],
                                        [1551]),
    "cancelled-between-its-parts": (ended_between_its_parts("cancel"), {"max_queue_tokens": 128}, [],
                                    list(range(1600, 1612))),
    "deadline-passed-between-its-parts": (ended_between_its_parts("deadline"), {"max_queue_tokens": 128}, [],
                                          list(range(1600, 1612))),
}


@pytest.mark.parametrize("name", RACES)
def test_a_request_ended_at_any_point_leaves_the_others_their_rows(engine, logs, monkeypatch, name):
    """The victim ends as its race says, the others get their own rows, the batcher serves on with an empty queue,
    and nothing is logged at error level."""
    race, limits, ran, unrun = RACES[name]
    others = [item(n, 1000 + n) for n in (12, 20, 28)]  # 60 tokens

    async def scenario(batcher, runner):
        blocker = submit(batcher, [item(6, 1001)])
        await until(lambda: len(runner.batches) == 1)  # running, held: what follows stays queued
        answered, ended = await race(batcher, runner, monkeypatch, others)
        runner.release()
        await blocker
        for task, error in ended.items():
            with pytest.raises(error):
                await task
        return [await task for task in answered]

    rows, runner = serve(engine, scenario, held=True, **limits)
    for x, got in zip(others, rows, strict=True):
        assert_rows([x], got, engine)
    assert [m for m in ran if not runner.ran(m)] == [] and [m for m in unrun if runner.ran(m)] == []
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

    async def scenario(batcher, runner):
        return await asyncio.gather(*(one(batcher, r, f) for r, f in zip(inputs, fates, strict=True)))

    results, _ = serve(engine, scenario, max_wait_s=0.005, max_batch_tokens=256)
    for request, fate, result in zip(inputs, fates, results, strict=True):
        if fate == "keep":
            assert isinstance(result, list)
            assert_rows(request, result, engine)
    assert_no_errors(logs)


# --- the gRPC door in this process: a call its deadline ended, and a bounded soak ------------------------------

SOAK_SECONDS, CALLS_PER_CLIENT, CLIENTS = 10.0, 60, 4  # new calls stop then; those in flight end within seconds
SHORT = ["The quick brown fox jumps over the lazy dog.", "Kittens drink milk.",
         "Ünïcödé: naïve café, façade, Straße.", "The stock market fell on Monday."]
LONG = " ".join(f"word{i} and more text" for i in range(150))  # past max_seq_length: truncated
LATE = "late"  # a text whose request the patched service answers only after the call's deadline


@asynccontextmanager
async def grpc_stub(engine) -> AsyncIterator[tuple[Server, encoder_pb2_grpc.EncoderStub]]:
    """The server's gRPC doors, in this process and loop, over the session's engine, on a loopback port."""
    config = ServerConfig(host="127.0.0.1", port=0, http_port=-1, metrics_port=-1, grace_seconds=5.0)
    metrics = Metrics()
    server = Server(Models([ServedModel("minilm", (), engine, config, metrics)]), config, metrics)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield server, encoder_pb2_grpc.EncoderStub(channel)
    finally:
        await server.stop()
        # The tasks of calls grpc ended may still be unwinding; the loop's end would cancel them.
        if others := asyncio.all_tasks() - {asyncio.current_task()}:
            await asyncio.wait(others, timeout=5)


def vectors(reply: pb.EmbedResponse) -> list[np.ndarray]:
    return [np.frombuffer(e.sentence_embedding.data, dtype="<f4") for e in reply.embeddings]


def embed(texts: list[str]) -> pb.EmbedRequest:
    return pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts])


def own_write_failed(error: grpc.aio.AioRpcError) -> bool:
    """The status grpc's aio client gives a stream call itself when writing one of its requests fails, the call
    having ended meanwhile (its deadline passed, or the client cancelled it: grpc/grpc#36066); no server sent it.
    The error names the failed write as 'Failed "send_message"' or 'Failed "execute_batch": (<...SendMessageOperation
    object ...>,)', by where in the core the batch failed."""
    where = error.debug_error_string() or ""
    return (error.code() == grpc.StatusCode.INTERNAL and error.details() == "Internal error from Core"
            and ("send_message" in where or "SendMessageOperation" in where))


BAD_REQUESTS = [
    pb.EmbedRequest(),  # no inputs
    pb.EmbedRequest(inputs=[pb.Input(text="hi")], model="no-such-model"),
    pb.EmbedRequest(inputs=[pb.Input(token_ids=pb.TokenIds(ids=[101, 10**9, 102]))]),
    pb.EmbedRequest(inputs=[pb.Input(text="hi")], dimensions=100000),
    pb.EmbedRequest(inputs=[pb.Input(text=LONG)], truncate=False),
]


class Client:
    """One soak client: a seeded mix of calls, each status counted, each good reply's rows checked against the same
    inputs embedded alone."""

    def __init__(self, stub, seed: int, expected: dict[str, np.ndarray], ids: list[int], attention: bool):
        self.stub, self.rng, self.expected, self.ids = stub, random.Random(seed), expected, ids
        self.kinds = ["short", "long", "ids", "tokens", "stream", "bad", "cancel", "deadline", "stream_cancel",
                      "stream_deadline", *(["attention"] if attention else [])]
        self.codes: Counter = Counter()
        self.wrong_rows: list[str] = []
        self.bad: list[str] = []  # the calls answered INTERNAL or UNKNOWN: what they were, what they got

    async def run(self, end: float) -> None:
        for _ in range(CALLS_PER_CLIENT):
            if time.monotonic() > end:
                return
            kind = self.rng.choice(self.kinds)
            try:
                await self.call(kind)
                self.codes["OK"] += 1
            except grpc.aio.AioRpcError as error:
                if kind.startswith("stream_") and own_write_failed(error):
                    self.codes["own write failed"] += 1
                    continue
                self.codes[error.code().name] += 1
                if error.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
                    self.bad.append(f"{kind}: {error.code().name} {error.details()} [{error.debug_error_string()}]")
            except asyncio.CancelledError:  # a call this client cancelled
                self.codes["CANCELLED"] += 1

    def check(self, texts: list[str], reply: pb.EmbedResponse) -> pb.EmbedResponse:
        self.wrong_rows += [t for t, got in zip(texts, vectors(reply), strict=True)
                            if float(got @ self.expected[t]) < 0.999]  # both normalised
        return reply

    async def embed(self, texts: list[str], tokens: bool = False, attention: pb.AttentionOptions | None = None):
        request = embed(texts)
        request.return_token_embeddings = tokens
        if attention is not None:
            request.attention.CopyFrom(attention)
        return self.check(texts, await self.stub.Embed(request, timeout=30)).embeddings[0]

    async def call(self, kind: str) -> None:
        rng, stub = self.rng, self.stub
        match kind:
            case "short":
                await self.embed(rng.sample(SHORT, rng.choice((1, 2, 3))))
            case "long":
                await self.embed([LONG])
            case "tokens":
                first = await self.embed(rng.sample(SHORT, 1), tokens=True)
                assert first.token_embeddings.shape[0] == first.num_tokens
            case "attention":
                first = await self.embed(rng.sample(SHORT, 1), attention=pb.AttentionOptions(layers=[-1],
                                                                                             average_heads=True))
                assert first.attentions.data
            case "ids":  # SHORT[0]'s
                request = pb.EmbedRequest(inputs=[pb.Input(token_ids=pb.TokenIds(ids=self.ids))])
                self.check([SHORT[0]], await stub.Embed(request, timeout=30))
            case "stream":
                texts = [rng.sample(SHORT, 1) for _ in range(rng.choice((2, 3, 5)))]
                replies = [reply async for reply in stub.EmbedStream(iter(map(embed, texts)), timeout=30)]
                for t, reply in zip(texts, replies, strict=True):
                    self.check(t, reply)
            case "bad":
                await stub.Embed(rng.choice(BAD_REQUESTS), timeout=30)
            case "cancel":
                call = stub.Embed(embed([*rng.sample(SHORT, 2), LONG]), timeout=30)
                await asyncio.sleep(rng.random() * 0.03)
                call.cancel()
                await call
            case "deadline":
                await stub.Embed(embed([*rng.sample(SHORT, 2), LONG]), timeout=0.001 + rng.random() * 0.04)
            case "stream_cancel":
                requests = [embed(rng.sample(SHORT, 1)) for _ in range(rng.choice((2, 3, 5)))]
                call = stub.EmbedStream(iter(requests), timeout=30)
                async for _ in call:
                    call.cancel()
            case "stream_deadline":
                async for _ in stub.EmbedStream(iter([embed([LONG])] * 3), timeout=0.005 + rng.random() * 0.05):
                    pass


@pytest.fixture
def late_answers(monkeypatch: pytest.MonkeyPatch) -> list[grpc.StatusCode]:
    """EncoderService answers a request for LATE past its call's deadline with DeadlineExpiredError, the loop blocked
    meanwhile (time.sleep), so that grpc, whose core ends the call at its deadline, cannot cancel the handler
    first: the race the soak met, made certain. Returns the codes the call was aborted with (abort spied on)."""
    real_embed, real_abort = EncoderService._embed, calls_module.abort
    aborted: list[grpc.StatusCode] = []

    async def embed_late(self: EncoderService, request: pb.EmbedRequest, context) -> tuple[bytes, int]:
        if any(x.text == LATE for x in request.inputs):
            time.sleep((context.time_remaining() or 0.0) + 0.1)
            raise DeadlineExpiredError("the request's deadline passed before it was answered")
        return await real_embed(self, request, context)

    async def spied_abort(context, status: grpc.Status) -> Any:
        aborted.append(status.code)
        return await real_abort(context, status)

    monkeypatch.setattr(EncoderService, "_embed", embed_late)
    monkeypatch.setattr(calls_module, "abort", spied_abort)
    return aborted


@pytest.mark.parametrize("method", ["Embed", "EmbedStream"])
def test_a_call_its_deadline_ended_is_not_aborted_and_logs_nothing(engine, logs, late_answers, method):
    async def scenario() -> tuple[grpc.StatusCode, pb.EmbedResponse]:
        async with grpc_stub(engine) as (_, stub):
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

    async def refusing_abort(context, status: grpc.Status) -> Any:
        refused.append(status.code)
        raise ExecuteBatchError('Failed "execute_batch"')

    monkeypatch.setattr(calls_module, "abort", refusing_abort)

    async def scenario() -> grpc.StatusCode:
        async with grpc_stub(engine) as (_, stub):
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await stub.Embed(pb.EmbedRequest(), timeout=0.3)  # no inputs: INVALID_ARGUMENT, never sent
            return ended.value.code()

    assert asyncio.run(scenario()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert refused == [grpc.StatusCode.INVALID_ARGUMENT]
    assert_no_errors(logs)


def test_a_soak_of_mixed_calls_cancels_and_deadlines_gets_no_internal_error_and_logs_none(engine, logs):
    async def soak() -> tuple[list[Client], pb.EmbedResponse]:
        async with grpc_stub(engine) as (server, stub):
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
    codes = sum((client.codes for client in clients), Counter())
    assert not [bad for client in clients for bad in client.bad], codes
    assert codes.get("OK", 0) >= 20 and codes.get("CANCELLED", 0) and codes.get("DEADLINE_EXCEEDED", 0), codes
    assert sum(codes.values()) <= CLIENTS * CALLS_PER_CLIENT
    assert not [text for client in clients for text in client.wrong_rows]
    assert len(after.embeddings) == len(SHORT)
    assert_no_errors(logs)
