"""The protocol-neutral core in this process, with no door and no network: real engines and batchers, called as a
door calls them; each error is the neutral one both doors map from."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import numpy as np
import pytest

from attnserve.config import ServerConfig
from attnserve.engine.engine import Engine
from attnserve.engine.outputs import EncodeReply
from attnserve.errors import (
    DeadlineExpiredError,
    InvalidInputError,
    ModelNotFoundError,
    NotServingError,
    QueueFullError,
    ShuttingDownError,
)
from attnserve.server.core import Core, Deadline
from attnserve.server.metrics import Metrics
from attnserve.server.models import Models, ServedModel
from attnserve.server.requests import AttentionOptions, EncodeRequest
from attnserve.server.score_requests import RerankRequest
from tests.test_batcher import until

TEXTS = ["The quick brown fox jumps over the lazy dog.", "a", "Ünïcödé: naïve café, façade, Straße."]
QUERY = "what do cats eat"
DOCUMENTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk."]
LONG = "word " * 200  # about 200 tokens


@asynccontextmanager
async def running(*engines: tuple[str, Engine], warm: bool = True, **settings) -> AsyncIterator[Core]:
    """A core over one batcher per engine, as the server builds it (server/app.py), in this event loop."""
    config = ServerConfig(**settings)
    models = Models([ServedModel(name, (), engine, config, Metrics()) for name, engine in engines])
    with ThreadPoolExecutor(2) as io:
        core = Core(models, config, io)
        for model in models.all:
            model.batcher.start()
        if warm:
            core.warmed_up()
        try:
            yield core
        finally:
            for model in models.all:
                model.batcher.close()
                await model.batcher.join()
                model.inference.shutdown(wait=True)


async def encode(core: Core, request: EncodeRequest, deadline: Deadline | None = None) -> EncodeReply:
    """core.encode with a door's renderer that keeps the neutral reply, for the test to read."""
    replies: list[EncodeReply] = []

    def render(reply: EncodeReply) -> bytes:
        replies.append(reply)
        return b"rendered"

    body, tokens = await core.encode(request, deadline, render)
    assert body == b"rendered" and tokens == replies[0].tokens
    return replies[0]


class Gated:
    """An engine whose batches wait for the test to open the gate: what was taken into a batch stays in flight."""

    def __init__(self, engine: Engine):
        self._engine, self.gate, self.running = engine, threading.Event(), threading.Event()

    def run(self, inputs, attention: bool = False, last_layer: bool = False, token_states: bool = True,
            narrow: bool = False):
        self.running.set()
        assert self.gate.wait(30)
        return self._engine.run(inputs, attention, last_layer, token_states, narrow)

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


def test_a_core_s_readiness_answers_and_drain(engine):
    """Not ready until warmed up; the engine's normalised vectors in request order; attention with every head when
    none is asked, named in the reply so that no door works them out itself; a model not served; then the drain."""
    async def scenario():
        async with running(("minilm", engine), warm=False) as core:
            with pytest.raises(NotServingError, match="warming up"):
                core.check_ready()
            core.warmed_up()
            core.check_ready()
            replies = (await encode(core, EncodeRequest(TEXTS)),
                       await encode(core, EncodeRequest(TEXTS[:1], attention=AttentionOptions())),
                       await encode(core, EncodeRequest(TEXTS[:1], attention=AttentionOptions(heads=[-1, 0]))))
            with pytest.raises(ModelNotFoundError, match="'nope' does not exist here; this server serves 'minilm'"):
                await encode(core, EncodeRequest(["x"], model="nope"))
            with pytest.raises(ModelNotFoundError):
                await core.rerank(RerankRequest(QUERY, DOCUMENTS, model="nope"), None)
            core.drain()
            with pytest.raises(NotServingError, match="shutting down"):
                core.check_ready()
            with pytest.raises(ShuttingDownError, match="retry on another replica"):
                await encode(core, EncodeRequest(["refused"]))
            with pytest.raises(ShuttingDownError):
                await core.rerank(RerankRequest(QUERY, DOCUMENTS), None)
            return replies

    reply, every, two = asyncio.run(scenario())
    alone = engine.run(engine.tokenizer.encode_texts(TEXTS)).sentence_embedding
    np.testing.assert_allclose(reply.embeddings, alone / np.linalg.norm(alone, axis=1, keepdims=True), atol=1e-5)
    assert reply.model == "minilm"
    assert [x.num_tokens for x in reply.inputs] == [len(x) for x in engine.tokenizer.encode_texts(TEXTS)]
    m = engine.manifest
    assert every.options.attention_layers == (m.num_layers - 1,)
    assert every.options.attention_heads == tuple(range(m.num_heads))
    tokens = every.inputs[0].num_tokens
    assert every.inputs[0].attentions.shape == (1, m.num_heads, tokens, tokens)
    assert two.options.attention_heads == (m.num_heads - 1, 0)
    np.testing.assert_array_equal(two.inputs[0].attentions[0], every.inputs[0].attentions[0, [m.num_heads - 1, 0]])


def test_rerank_scores_pairs_best_first_and_a_reranker_does_not_embed(engine, reranker_artifacts):
    reranker = Engine.from_directory(reranker_artifacts)

    async def scenario():
        async with running(("minilm", engine), ("tiny-reranker", reranker)) as core:
            reply = await core.rerank(RerankRequest(QUERY, DOCUMENTS, return_text=True, model="tiny-reranker"), None)
            with pytest.raises(InvalidInputError, match="tiny-reranker is a reranker"):
                await encode(core, EncodeRequest(["x"], model="tiny-reranker"))
            with pytest.raises(InvalidInputError, match="not a reranker"):
                await core.rerank(RerankRequest(QUERY, DOCUMENTS), None)
            return reply

    reply = asyncio.run(scenario())
    logits = reranker.run(reranker.tokenizer.encode_pairs([(QUERY, text) for text in DOCUMENTS])).scores[:, 0]
    order = np.argsort(-logits, kind="stable")
    assert reply.model == "tiny-reranker" and [r.index for r in reply.results] == list(order)
    assert [r.text for r in reply.results] == [DOCUMENTS[i] for i in order]
    np.testing.assert_allclose([r.score for r in reply.results], 1 / (1 + np.exp(-logits[order])), rtol=1e-5)


def test_a_deadline_passed_ends_the_call_and_drops_its_queued_inputs(engine):
    """Whatever the door: the error names the deadline as the client set it, and the inputs that waited never cost
    compute."""
    async def scenario():
        gated = Gated(engine)
        async with running(("minilm", gated)) as core:  # type: ignore[arg-type]
            gated.gate.set()
            with pytest.raises(DeadlineExpiredError, match="the request's deadline passed before it was answered"):
                await encode(core, EncodeRequest(["x"]), Deadline(time.monotonic() - 1))
            gated.gate.clear()
            ahead = asyncio.ensure_future(encode(core, EncodeRequest(["taken into a batch"])))
            await until(gated.running.is_set)
            start = time.monotonic()
            with pytest.raises(DeadlineExpiredError, match="request's X-Test-Timeout passed before it was answered"):
                await encode(core, EncodeRequest([LONG] * 4), Deadline(start + 0.2, "X-Test-Timeout"))
            assert 0.15 < time.monotonic() - start < 5
            assert core.models.default.batcher.queued_tokens == 0  # those queued behind the running batch are gone
            gated.gate.set()
            assert (await ahead).embeddings.shape == (1, engine.manifest.embedding_size)

    asyncio.run(scenario())


def test_a_full_queue_is_queue_full_and_a_request_larger_than_the_queue_is_admitted_in_parts(engine):
    """Refused while the queue is full, as any request is; admitted in parts once there is room, answered whole."""
    async def scenario():
        gated = Gated(engine)
        async with running(("minilm", gated), max_queue_tokens=300) as core:  # type: ignore[arg-type]
            taken = asyncio.ensure_future(encode(core, EncodeRequest([LONG])))  # runs first, held by the gate
            await until(gated.running.is_set)
            queued = asyncio.ensure_future(encode(core, EncodeRequest([LONG])))  # waits in the queue
            await until(lambda: core.models.default.batcher.queued_tokens > 0)
            with pytest.raises(QueueFullError, match="queue full") as full:
                await encode(core, EncodeRequest([LONG]))
            assert full.value.retry_after > 0
            with pytest.raises(QueueFullError, match="queue full"):
                await encode(core, EncodeRequest([LONG, LONG, LONG]))
            gated.gate.set()
            assert len((await taken).inputs) == len((await queued).inputs) == 1
            big = await encode(core, EncodeRequest([LONG, "short", LONG]))
            want = engine.encode([LONG, "short", LONG], normalize=True).embeddings
            np.testing.assert_allclose(big.embeddings, want, atol=1e-5)

    asyncio.run(scenario())


def test_a_request_admitted_in_parts_is_answered_whole_when_the_drain_starts_between_its_parts(engine):
    async def scenario():
        gated = Gated(engine)
        async with running(("minilm", gated), max_queue_tokens=300) as core:  # type: ignore[arg-type]
            texts = [LONG, LONG + "again", LONG + "and again"]  # a part each: 3 x ~200 tokens in a 300-token queue
            big = asyncio.ensure_future(encode(core, EncodeRequest(texts)))
            await until(gated.running.is_set)  # the first part runs, held by the gate; the later ones wait
            core.models.default.batcher.close()  # the drain's start: no new request, but this one was admitted
            gated.gate.set()
            np.testing.assert_allclose((await big).embeddings, engine.encode(texts, normalize=True).embeddings,
                                       atol=1e-5)
            with pytest.raises(ShuttingDownError):
                await encode(core, EncodeRequest(["after the drain began"]))

    asyncio.run(scenario())
