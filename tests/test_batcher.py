"""The batcher on its own, around the real engine: what it batches together, what it drops, what it refuses."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from attnserve.engine.tokenizer import TokenizedInput
from attnserve.errors import BatchFailedError, DeadlineExpiredError, QueueFullError, ShuttingDownError
from attnserve.server.batch_wait import BatchWait
from attnserve.server.batcher import Batcher, BatcherLimits
from attnserve.server.metrics import Metrics

POISON = 4242  # a token id that makes the recording runner's batch fail


class RecordingRunner:
    """Engine.run, recording each batch's lengths; a batch holding POISON fails like a broken session would."""

    def __init__(self, engine, gate: threading.Event | None = None):
        self.engine, self.gate, self.batches = engine, gate, []

    def __call__(self, inputs, attention, last_layer=False):
        if self.gate is not None:
            self.gate.wait(30)
        self.batches.append(([len(x) for x in inputs], attention))
        if any(POISON in x.ids for x in inputs):
            raise RuntimeError("simulated onnxruntime failure")
        return self.engine.run(inputs, attention, last_layer)


def item(length: int, token: int = 1000) -> TokenizedInput:
    return TokenizedInput(np.array([101] + [token] * (length - 2) + [102], dtype=np.int64), False)


def run(engine, scenario, gate=None, runner=None, **limits):
    """scenario(batcher, runner) inside a fresh event loop with a started batcher (a RecordingRunner's unless
    given another runner)."""
    runner = runner or RecordingRunner(engine, gate)
    settings = dict(max_batch_tokens=2048, max_batch_size=256, max_queue_tokens=65536, max_wait_s=0.002)
    settings.update(limits)

    async def main():
        with ThreadPoolExecutor(settings.get("in_flight", 1)) as executor:
            batcher = Batcher(runner, BatcherLimits(**settings), Metrics().for_model("m"), executor)
            batcher.start()
            try:
                return await scenario(batcher, runner)
            finally:
                if gate is not None:
                    gate.set()
                batcher.close()
                await batcher.join()

    return asyncio.run(main()), runner


def test_rows_come_back_in_request_order_and_equal_a_lone_run(engine):
    inputs = [item(n) for n in (5, 200, 17, 64, 3, 128)]

    async def scenario(batcher, runner):
        return await batcher.submit(inputs, attention=False, deadline=None)

    rows, _ = run(engine, scenario)
    for x, row in zip(inputs, rows, strict=True):
        alone = engine.run([x])
        assert row.token_embeddings.shape == (len(x), 384)
        np.testing.assert_allclose(row.sentence_embedding, alone.sentence_embedding[0], atol=1e-5)


class OverlapRunner:
    """A runner whose first batch holds until a later one has started: only batches in flight at once finish."""

    def __init__(self, engine):
        self.engine, self.started, self.first, self.most = engine, 0, threading.Event(), 0
        self._lock, self._running = threading.Lock(), 0

    def __call__(self, inputs, attention, last_layer=False):
        with self._lock:
            self.started += 1
            first = self.started == 1
            self._running += 1
            self.most = max(self.most, self._running)
        try:
            if first:
                assert self.first.wait(30), "no second batch ran beside the first"
            else:
                self.first.set()
            return self.engine.run(inputs, attention, last_layer)
        finally:
            with self._lock:
                self._running -= 1


def test_batches_in_flight_run_side_by_side_and_answer_each_their_own_rows(engine):
    """--batches-in-flight 2: a second batch runs while the first does, every row is the input's own, and the
    drain (close, join) waits for both."""
    inputs = [item(n, token=1000 + n) for n in (5, 9, 40, 120, 7, 64, 33, 250)]

    async def scenario(batcher, runner):
        first = asyncio.ensure_future(batcher.submit(inputs[:1], False, None))
        await asyncio.sleep(0.05)  # the first batch is running, and holds
        rest = [asyncio.ensure_future(batcher.submit([x], False, None)) for x in inputs[1:]]
        return [*(await first), *[row for r in await asyncio.gather(*rest) for row in r]]

    rows, runner = run(engine, scenario, runner=OverlapRunner(engine), max_batch_tokens=256, max_wait_s=0.0,
                       in_flight=2)
    assert runner.most == 2 and runner.started >= 2
    for x, row in zip(inputs, rows, strict=True):
        np.testing.assert_allclose(row.sentence_embedding, engine.run([x]).sentence_embedding[0], atol=1e-5)


def test_concurrent_requests_are_batched_by_length(engine):
    rng = np.random.default_rng(0)
    lengths = rng.choice([6, 7, 8, 30, 31, 32, 120, 128], size=64)

    async def scenario(batcher, runner):
        return await asyncio.gather(*(batcher.submit([item(int(n))], False, None) for n in lengths))

    _, runner = run(engine, scenario, max_wait_s=0.05)
    sizes = [len(b) for b, _ in runner.batches]
    assert sum(sizes) == 64 and len(sizes) < 16  # batched, not one by one
    cells = sum(max(b) * len(b) for b, _ in runner.batches)
    assert 1 - lengths.sum() / cells <= 0.05  # similar lengths went together
    for batch, _ in runner.batches:
        assert max(batch) * len(batch) <= 2048 and len(batch) <= 256


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
    (full, small), _ = run(engine, scenario, max_wait_s=1.0, max_batch_tokens=64)
    assert full < 0.5 and 1.0 <= small < 3.0


def test_an_idle_server_runs_a_lone_request_at_once(engine):
    async def scenario(batcher, runner):
        waits = []
        for _ in range(5):  # one client at a time: nothing would ever arrive during a wait
            start = time.monotonic()
            await batcher.submit([item(8)], False, None)
            waits.append(time.monotonic() - start)
        return waits, batcher.wait.under_load

    (waits, under_load), runner = run(engine, scenario, max_wait_s=0.5)
    assert not under_load and max(waits) < 0.25  # far under the 0.5 s max_wait
    assert [len(b) for b, _ in runner.batches] == [1] * 5


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
        poisoned = batcher.submit([item(5, token=POISON)], False, None)
        other_length = batcher.submit([item(250)], False, None)  # planned into a batch of its own
        other_graph = batcher.submit([item(5)], True, None)  # the attention graph: another batch
        results = await asyncio.gather(poisoned, other_length, other_graph, return_exceptions=True)
        after = await batcher.submit([item(9)], False, None)  # still serving
        return results, after

    (results, after), runner = run(engine, scenario, max_wait_s=0.05)
    assert isinstance(results[0], BatchFailedError) and "retry" in str(results[0])
    assert results[1][0].sentence_embedding.shape == (384,)
    assert results[2][0].attentions.shape == (6, 12, 5, 5)
    assert after[0].sentence_embedding.shape == (384,)


def test_cancelled_requests_are_dropped_before_they_cost_compute(engine):
    gate = threading.Event()

    async def scenario(batcher, runner):
        blocker = asyncio.ensure_future(batcher.submit([item(256)] * 8, False, None))  # holds the session
        await asyncio.sleep(0.05)
        doomed = asyncio.ensure_future(batcher.submit([item(256)] * 40, False, None))
        await asyncio.sleep(0.05)
        doomed.cancel()
        await asyncio.sleep(0.01)
        queued_after_cancel = batcher.queued_tokens
        gate.set()
        await blocker
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return queued_after_cancel

    queued, runner = run(engine, scenario, gate=gate)
    assert queued == 0
    assert sum(len(b) for b, _ in runner.batches) == 8  # only the blocker's inputs ran


def test_expired_deadline_drops_queued_inputs(engine):
    gate = threading.Event()

    async def scenario(batcher, runner):
        blocker = asyncio.ensure_future(batcher.submit([item(256)] * 8, False, None))
        await asyncio.sleep(0.05)
        with pytest.raises(DeadlineExpiredError):
            await batcher.submit([item(64)] * 4, False, time.monotonic() - 1)  # already past
        late = asyncio.ensure_future(batcher.submit([item(64)] * 4, False, time.monotonic() + 0.05))
        await asyncio.sleep(0.1)
        gate.set()
        await blocker
        with pytest.raises(DeadlineExpiredError):
            await late

    _, runner = run(engine, scenario, gate=gate)
    assert sum(len(b) for b, _ in runner.batches) == 8


def test_queue_full_is_refused_at_once_and_close_refuses_new_work(engine):
    gate = threading.Event()

    async def scenario(batcher, runner):
        running = asyncio.ensure_future(batcher.submit([item(256)] * 4, False, None))  # taken into the batch
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(batcher.submit([item(200)] * 4, False, None))  # 800 of 1024 tokens
        await asyncio.sleep(0.01)
        submitted = batcher.submit([item(300)], False, None)
        with pytest.raises(QueueFullError, match="queue full: 800 of 1024 tokens waiting"):
            submitted.send(None)  # refused in its first step: it never waits on the queue (no clock to read)
        fits = asyncio.ensure_future(batcher.submit([item(200)], False, None))  # 1000 of 1024: accepted
        await asyncio.sleep(0)  # let it enter the queue
        batcher.close()
        with pytest.raises(ShuttingDownError):
            await batcher.submit([item(5)], False, None)
        gate.set()
        return [len(r) for r in await asyncio.gather(running, queued, fits)]

    answered, _ = run(engine, scenario, gate=gate, max_queue_tokens=1024)
    assert answered == [4, 4, 1]  # everything accepted is answered, even after close


def test_a_batcher_bug_fails_the_queued_requests_instead_of_hanging(engine, monkeypatch):
    import attnserve.server.batcher as batcher_module

    real, calls = batcher_module.plan_batches, []

    def planner_with_a_bug(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a planner bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(batcher_module, "plan_batches", planner_with_a_bug)

    async def scenario(batcher, runner):
        with pytest.raises(BatchFailedError, match="batcher failed"):
            await asyncio.wait_for(batcher.submit([item(8)], False, None), 10)
        return await batcher.submit([item(8)], False, None)  # the owner lives on

    rows, _ = run(engine, scenario)
    assert rows[0].sentence_embedding.shape == (384,)


def test_a_time_bound_refuses_by_the_work_queued_ahead_not_the_request_size(engine):
    gate = threading.Event()  # holds the first batch in the session, so what follows stays queued

    async def scenario(batcher, runner):
        batcher.learn_rate(False, seconds=0.5, tokens=1000, cells=2048)  # 0.5 ms a token, as warm-up would seed
        running = asyncio.ensure_future(batcher.submit([item(8)], False, None))
        await asyncio.sleep(0.05)
        # An empty queue takes any request, however long it will run: 8 x 200 tokens ~ 0.8 s > the 0.5 s bound.
        big = asyncio.ensure_future(batcher.submit([item(200)] * 8, False, None))
        await asyncio.sleep(0.01)
        assert batcher.queued_seconds == pytest.approx(0.8)
        with pytest.raises(QueueFullError, match="about 800 ms of work waiting, more than the server's limit of 500"):
            batcher.check_room(1)  # what the service asks before it tokenizes anything
        submitted = batcher.submit([item(5)], False, None)
        with pytest.raises(QueueFullError, match="about 800 ms"):
            submitted.send(None)  # refused in its first step: it never waits on the queue (no clock to read)
        gate.set()
        return [len(r) for r in await asyncio.gather(running, big)]

    answered, _ = run(engine, scenario, gate=gate, max_queue_wait_s=0.5)
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
    """plan_batches' shortcut (inputs alike in length that fit one batch are one batch) gives plans exactly as cheap
    as the full search, checked against an exhaustive one over random queues of alike and of mixed lengths."""
    from attnserve.engine.batching import BATCH_OVERHEAD_CELLS, plan_batches

    def cost(plan, lengths):
        return sum(int(lengths[p].max()) * len(p) + BATCH_OVERHEAD_CELLS for p in plan)

    def best(lengths, budget, size_cap):
        s = sorted(lengths.tolist(), reverse=True)
        costs = [0.0] + [float("inf")] * len(s)
        for j in range(1, len(s) + 1):
            for i in range(j):
                n = j - i
                if n <= size_cap and (n == 1 or s[i] * n <= budget):
                    costs[j] = min(costs[j], costs[i] + s[i] * n + BATCH_OVERHEAD_CELLS)
        return costs[-1]

    rng = np.random.default_rng(0)
    for _ in range(500):
        n, base = int(rng.integers(1, 30)), int(rng.integers(1, 200))
        spread = int(rng.choice([1, 3, 8, 150]))
        lengths = base + rng.integers(0, spread, n)
        budget, size_cap = int(rng.choice([256, 512, 2048])), int(rng.choice([4, 16, 256]))
        plan = plan_batches(lengths, budget, size_cap)
        assert sorted(np.concatenate(plan).tolist()) == list(range(n))
        assert cost(plan, lengths) == best(lengths, budget, size_cap)
