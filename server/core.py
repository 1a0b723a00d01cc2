"""The protocol-neutral core under every front door, as TEI's core stands under its HTTP and gRPC routers.

A door (grpc/ for gRPC, http/ for HTTP) translates its wire format into a request of requests.py, calls
one method here, and translates what comes back, or the error raised, with its own mapping. Everything else
happens here once: resolving the model a request names (models.py; None is the default model), validation and
every limit (requests.py), admission and submission to that model's batcher, the request's deadline (the call
runs under it and ends with DeadlineExpiredError, on every door), pooling, `dimensions` and normalisation
(engine/outputs.py), readiness, the count of requests in progress that a drain waits for, and returning memory after
large replies. Tokenizing, building a reply and the door's serialization of it run in the thread pool, except for
a small request (requests.light, light_reply), whose work costs less than the hop to a thread and back.

The core reads its models through contract.py's declared contract alone (ModelsContract: models.py's in one process,
workers/front.py's in a front-door worker of `serve --workers N`), so that mypy checks both for what is read here.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from functools import partial
from typing import TypeVar, cast

import aiohttp

from attnserve.config import ServerConfig
from attnserve.engine.output_options import PreparedRequest
from attnserve.engine.outputs import EncodeReply, build_reply
from attnserve.engine.scores import (
    PredictReply,
    RerankReply,
    SimilarityReply,
    build_multi_vector_rerank_reply,
    build_predict_reply,
    build_rerank_reply,
    build_similarity_reply,
)
from attnserve.engine.tokenizer import Token
from attnserve.errors import InvalidInputError, NotServingError, ShuttingDownError

from . import tracing
from .build_wait import once_built
from .contract import EngineContract, ModelContract, ModelsContract
from .embed_requests import prepare
from .image_inputs import ImageUrl, UrlPolicy, fetch_image
from .memory import MemoryReturn
from .models import ModelInfo
from .requests import Deadline, EncodeRequest, RequestLimits, light, light_reply, text_chars
from .score_requests import (
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    prepare_multi_vector_rerank,
    prepare_predict,
    prepare_rerank,
    similarity_error,
)
from .token_requests import DecodeRequest, TokenizeRequest, prepare_decode, prepare_tokenize
from .zero_shot import ZeroShotReply, ZeroShotRequest, build_zero_shot_reply, zero_shot_error

# A reply's float on a binary wire (protobuf, numpy bytes): what the reply size limit counts by default.
BINARY_FLOAT_BYTES = 4.0

__all__ = ["BINARY_FLOAT_BYTES", "Core", "Deadline", "ModelInfo"]

T = TypeVar("T")
R = TypeVar("R")  # what a door's render makes of an encode reply: its bytes, or similarity's scores
S = TypeVar("S")  # a scored request's reply: RerankReply, PredictReply
_TRACER = tracing.tracer()  # the no-op one unless --otlp-endpoint set a provider first (tracing.setup)
# Whether this task's request is counted in its model's statistics already: a door that counts a request from the
# moment it found the model (KServe's infer, whose parsing can refuse it) wraps the core's own count, which then
# counts nothing more (one request, one count).
_COUNTING: contextvars.ContextVar[bool] = contextvars.ContextVar("attnserve_counting", default=False)


class Core:
    def __init__(self, models: ModelsContract, config: ServerConfig, executor: Executor, workers: int = 1):
        """executor: the threads that tokenize and render (`workers` of them, as TEI's /info reports)."""
        self.models, self._executor, self.workers = models, executor, workers
        self.limits = RequestLimits(config.max_inputs_per_request, config.max_response_bytes, config.long_inputs,
                                    config.max_image_pixels)
        self._max_build_wait = config.max_build_wait  # how long a request waits for a graph it needs: build_wait.py
        # Image URLs: fetched only from the hosts the operator allows (none by default: server/image_inputs.py).
        self.url_policy = UrlPolicy(config.allow_image_urls, config.max_image_url_bytes, config.image_url_timeout)
        self._fetcher: aiohttp.ClientSession | None = None
        self._memory = MemoryReturn(executor)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_call = time.monotonic()
        self._warm = False
        self.draining = asyncio.Event()

    @property
    def info(self) -> ModelInfo:
        """The default model's description: what the routes without a model name describe (TEI's /info)."""
        return self.models.default.info

    # --- what a request may ask for -----------------------------------------

    def model(self, name: str | None) -> ModelContract:
        """The model a request names (None or "": the default one), or ModelNotFoundError naming those served."""
        return self.models.get(name)

    def counted(self, name: str | None):
        """A context around a request that reached the model named, from the moment it was found: its outcome and
        time in the model's statistics, whatever refuses it after (a door's parsing of its tensors, the core's
        checks, the batch). Triton's statistics count every request to a model found; KServe's doors use it."""
        return _counted(self.models.get(name))

    def check_open(self) -> None:
        """Refuse new requests once the drain began."""
        if self.draining.is_set():
            raise ShuttingDownError("the server is shutting down; retry on another replica")

    def check_ready(self) -> None:
        """Readiness, as health checks and probes report it: NotServingError before warm-up and while draining."""
        if not self.serving:
            raise NotServingError("the server is shutting down" if self.draining.is_set()
                                  else "the server is warming up")

    # --- the work -----------------------------------------------------------

    async def encode(self, request: EncodeRequest, deadline: Deadline | None,
                     render: Callable[[EncodeReply], R], float_bytes: float = BINARY_FLOAT_BYTES
                     ) -> tuple[R, int]:
        """One request through validation, tokenizer, batcher and reply; render is the door's serializer (its
        bytes), or what turns the reply into another (similarity's scores).

        deadline: None, or when the request must be answered by. float_bytes: what one float of the reply costs
        on the door's wire, for the reply size limit. Returns (the rendered reply, the request's tokens).
        """
        if deadline is None:  # most requests: no timer
            return await self._encode(request, deadline, render, float_bytes)
        return await _within(self._encode(request, deadline, render, float_bytes), deadline)

    async def similarity(self, request: SimilarityRequest, deadline: Deadline | None) -> SimilarityReply:
        """The cosine of each sentence with the source sentence: all of them encoded as one request, through
        the same batcher; errors name source_sentence and sentences[i]."""
        try:
            reply, _ = await self.encode(request.to_encode(), deadline, build_similarity_reply)
        except InvalidInputError as error:
            raise similarity_error(error) from None
        return reply

    async def zero_shot(self, request: ZeroShotRequest, deadline: Deadline | None) -> ZeroShotReply:
        """Each image's score for each label (server/zero_shot.py), all encoded as one request through the same
        batcher; errors name labels[i] and images[i]."""
        images = self.models.get(request.model).engine.manifest.images
        if images is None:
            raise InvalidInputError(f"{self.models.get(request.model).name} is a text model: zero-shot image "
                                    "classification needs an image-text model (CLIP, SigLIP)", field="model",
                                    description="a text model")
        try:
            reply, _ = await self.encode(request.to_encode(), deadline,
                                         partial(build_zero_shot_reply, labels=request.labels, images=images))
        except InvalidInputError as error:
            raise zero_shot_error(error, len(request.labels)) from None
        return reply

    async def _encode(self, request: EncodeRequest, deadline: Deadline | None,
                      render: Callable[[EncodeReply], R], float_bytes: float) -> tuple[R, int]:
        loop = asyncio.get_running_loop()
        self.check_open()
        model = self.models.get(request.model)
        body: R | bytes = b""
        self._memory.busy()
        try:
            with _counted(model), tracing.span(_TRACER, "request") as span:
                span.set_attributes({"attnserve.model": model.name, "attnserve.inputs": len(request.inputs)})
                if request.pooling == "default" and model.pooling != "default":  # serve --pooling
                    request = replace(request, pooling=model.pooling)
                engine, batcher = model.for_task(request.task)  # a batcher per task: a batch never mixes adapters
                batcher.check_room(len(request.inputs))  # a full queue costs no tokenizing
                if any(isinstance(item, ImageUrl) for item in request.inputs):
                    request = await self._fetch_images(request)
                with tracing.span(_TRACER, "tokenize"):  # a small request here, others in the pool (INLINE_*)
                    # A small request asks for nothing a graph is built for (requests.light): prepared at once.
                    prepared = (self._preparing(request, engine, float_bytes)() if light(request) else
                                await once_built(partial(self._prepare, request, engine, float_bytes),
                                                 engine.require, self._executor, self._max_build_wait, self.draining))
                tokens = prepared.tokens
                span.set_attribute("attnserve.tokens", tokens)
                rows = await batcher.submit(prepared.inputs, prepared.options.attention, _at(deadline),
                                            prepared.options.last_layer_only, prepared.token_states)
                with tracing.span(_TRACER, "reply"):
                    rendered = body = (self._render(rows, prepared, model, render) if light_reply(prepared) else
                                       await loop.run_in_executor(self._executor, self._render, rows, prepared,
                                                                  model, render))
                return rendered, tokens
        finally:
            self._memory.done(len(body) if isinstance(body, bytes) else 0, text_chars(request.inputs))

    def _preparing(self, request: EncodeRequest, engine: EngineContract, float_bytes: float
                   ) -> Callable[[], PreparedRequest]:
        """prepare() of the request, reading the engine's manifest as it is now (a build held for may have changed
        it: build_wait.once_built)."""
        return partial(prepare, request, engine.tokenizer, engine.manifest, self.limits, float_bytes,
                       engine.takes_token_types, engine.multi_vector, engine.require, engine.images)

    async def _prepare(self, request: EncodeRequest, engine: EngineContract, float_bytes: float) -> PreparedRequest:
        """prepare() in the pool: a request too large for the event loop (requests.light), or one that may wait for
        a graph."""
        return await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                self._preparing(request, engine, float_bytes))

    async def _fetch_images(self, request: EncodeRequest) -> EncodeRequest:
        """The request with each image it names by URL fetched (ImageBytes), where the server allows the host; the
        rest of it as it is. A refused or failed fetch is the request's 4xx, naming the input."""
        rows = [row for row, item in enumerate(request.inputs) if isinstance(item, ImageUrl)]
        if not rows:
            return request
        if self._fetcher is None:
            self._fetcher = aiohttp.ClientSession(trust_env=False)
        fetcher = self._fetcher

        async def fetched(row: int):
            try:
                return await fetch_image(cast(ImageUrl, request.inputs[row]).url, self.url_policy, fetcher)
            except InvalidInputError as error:
                raise InvalidInputError(f"input {row}: {error}", field=f"inputs[{row}]",
                                        description=str(error)) from None

        inputs = list(request.inputs)
        # At once, each within the policy's time: a request's URLs cost the slowest one's time, not their sum.
        for row, image in zip(rows, await asyncio.gather(*(fetched(row) for row in rows)), strict=True):
            inputs[row] = image
        return replace(request, inputs=inputs)

    async def close(self) -> None:
        """What the core holds open: the image fetcher's connections."""
        if self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None

    @staticmethod
    def _render(rows, prepared: PreparedRequest, model: ModelContract, render: Callable[[EncodeReply], R]) -> R:
        return render(build_reply(rows, prepared, model.engine.heads, model.name))

    async def rerank(self, request: RerankRequest, deadline: Deadline | None) -> RerankReply:
        """Score (query, text) pairs with a reranker through the same batcher as embeddings, sorted best first.

        deadline: None, or when the request must be answered by."""
        return await _within(self._rerank(request, deadline), deadline)

    async def _rerank(self, request: RerankRequest, deadline: Deadline | None) -> RerankReply:
        multi_vector = self.models.get(request.model).engine.multi_vector
        if multi_vector is not None:  # a ColBERT model: MaxSim of its query's and each document's vectors
            texts = len(request.texts) if isinstance(request.texts, Sequence) else 0  # checked when prepared
            return await self._scores(request.model, 1 + texts, _rerank_chars(request),
                                      lambda *_: prepare_multi_vector_rerank(request, multi_vector, self.limits),
                                      deadline, lambda rows, prepared, manifest, name: build_multi_vector_rerank_reply(
                                          rows, prepared, multi_vector, name))
        return await self._scores(request.model, len(request.texts), _rerank_chars(request),
                                  partial(prepare_rerank, request), deadline,
                                  lambda rows, prepared, manifest, name: build_rerank_reply(
                                      rows, prepared, manifest.score_activation, name))

    async def predict(self, request: PredictRequest, deadline: Deadline | None) -> PredictReply:
        """A classifier's scores for each text or pair, through the same batcher; every label, best first."""
        return await _within(self._predict(request, deadline), deadline)

    async def _predict(self, request: PredictRequest, deadline: Deadline | None) -> PredictReply:
        return await self._scores(request.model, len(request.inputs), text_chars(request.inputs),
                                  partial(prepare_predict, request), deadline,
                                  lambda rows, prepared, manifest, name: build_predict_reply(
                                      rows, prepared, manifest.label_names, manifest.problem_type, name))

    async def _scores(self, name: str | None, count: int, chars: int, prepare_scored: Callable,
                      deadline: Deadline | None, build: Callable[..., S]) -> S:
        """A request to a model with a classification head (rerank, predict): admission, tokenizing off the event
        loop (prepare_scored(tokenizer, manifest, limits, takes_token_types)), the batcher, then
        build(rows, prepared, manifest, the model's name). chars: the text it tokenizes, for the heaps' trims."""
        loop = asyncio.get_running_loop()
        self.check_open()
        model = self.models.get(name)
        engine, batcher = model.engine, model.batcher
        self._memory.busy()
        try:
            with _counted(model), tracing.span(_TRACER, "request") as span:
                span.set_attributes({"attnserve.model": model.name, "attnserve.inputs": count})
                batcher.check_room(count)  # a full queue costs no tokenizing
                with tracing.span(_TRACER, "tokenize"):
                    prepared = await loop.run_in_executor(self._executor, prepare_scored, engine.tokenizer,
                                                          engine.manifest, self.limits, engine.takes_token_types)
                span.set_attribute("attnserve.tokens", sum(len(x) for x in prepared.inputs))
                rows = await batcher.submit(prepared.inputs, False, _at(deadline))
                with tracing.span(_TRACER, "reply"):
                    return build(rows, prepared, engine.manifest, model.name)
        finally:
            self._memory.done(0, chars)

    async def tokenize(self, request: TokenizeRequest) -> list[list[Token]]:
        self.check_open()
        engine = self.models.get(request.model).engine
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, prepare_tokenize, request, engine.tokenizer, engine.manifest, self.limits)

    async def decode(self, request: DecodeRequest) -> list[str]:
        self.check_open()
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, prepare_decode, request, self.models.get(request.model).engine.tokenizer, self.limits)

    # --- serving state and requests in progress, for the drain ----------------

    def warmed_up(self) -> None:
        self._warm = True

    @property
    def serving(self) -> bool:
        """Warmed up and not draining: what health checks report."""
        return self._warm and not self.draining.is_set()

    def in_flight(self) -> _InFlight:
        """Around every request a door takes: the drain waits until none is in progress."""
        return _InFlight(self)

    def _began(self) -> None:
        self._in_flight += 1
        self._last_call = time.monotonic()
        self._idle.clear()

    def _ended(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    def drain(self) -> None:
        """Shutdown began: new requests are refused; open gRPC streams answer what they hold, then end."""
        self.draining.set()
        # The quiet the drain waits for counts from here at the earliest. Requests already on the wire while the
        # event loop was busy (a stall of over DRAIN_QUIET_SECONDS was seen under CI load) have not begun yet:
        # they must get their 503 / UNAVAILABLE before the listeners close, not a closed connection.
        self._last_call = time.monotonic()

    async def wait_quiet(self, timeout: float, quiet: float) -> bool:
        """Until no request is in progress and none began for `quiet` seconds. False if timeout passed first."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._idle.wait(), left)
            except asyncio.TimeoutError:
                return False
            since = time.monotonic() - self._last_call
            if since >= quiet:
                return True
            await asyncio.sleep(min(quiet - since, max(0.0, end - time.monotonic())))


def _rerank_chars(request: RerankRequest) -> int:
    """The characters a rerank tokenizes: each text, and the query once a pair (types are checked later)."""
    texts = request.texts if isinstance(request.texts, Sequence) and not isinstance(request.texts, str) else []
    return text_chars([request.query]) * max(1, len(texts)) + text_chars(texts)


class _InFlight:
    """Core.in_flight's context: a class, not a generator, as it is around every request."""

    __slots__ = ("_core",)

    def __init__(self, core: Core):
        self._core = core

    def __enter__(self) -> None:
        self._core._began()

    def __exit__(self, *exc) -> None:
        self._core._ended()


class _counted:
    """Around a request that reached its model: its outcome and time in the model's statistics (a failure for any
    error, and for a cancellation: a deadline passed, or the client left). Inside another count (_COUNTING), the
    outer one counts it. A class, not a generator: it is around every request."""

    __slots__ = ("_model", "_started", "_token")

    def __init__(self, model: ModelContract):
        self._model = model

    def __enter__(self) -> None:
        self._token = None if _COUNTING.get() else _COUNTING.set(True)
        self._started = time.perf_counter()

    def __exit__(self, kind, error, traceback) -> None:
        if self._token is None:
            return
        _COUNTING.reset(self._token)
        self._model.metrics.statistics.request(kind is None, time.perf_counter() - self._started)


async def _within(work: Awaitable[T], deadline: Deadline | None) -> T:
    """Await work; past the deadline, cancel it (its queued inputs are dropped) and raise DeadlineExpiredError."""
    if deadline is None:
        return await work
    if deadline.at <= time.monotonic():  # passed already: nothing of the work starts
        if asyncio.iscoroutine(work):
            work.close()
        raise deadline.expired()
    try:
        if _TIMEOUT_AT is None:  # Python 3.10: wait_for runs the work in a task of its own
            return await asyncio.wait_for(work, max(0.0, deadline.at - time.monotonic()))
        # 3.11+: the request's own task is cancelled at the deadline (the loop's clock is time.monotonic()), no
        # second task and its hand-offs for every request that carries a deadline (gRPC clients mostly do)
        async with _TIMEOUT_AT(deadline.at):
            return await work
    except asyncio.TimeoutError:
        raise deadline.expired() from None


_TIMEOUT_AT = getattr(asyncio, "timeout_at", None)


def _at(deadline: Deadline | None) -> float | None:
    """The batcher's view of a deadline: a time.monotonic() value, to drop inputs whose deadline passed unrun."""
    return None if deadline is None else deadline.at
