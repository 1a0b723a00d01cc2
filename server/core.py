"""The protocol-neutral core under every front door, as TEI's core stands under its HTTP and gRPC routers.

A door (service.py for gRPC, http/ for HTTP) translates its wire format into a request of requests.py, calls
one method here, and translates what comes back, or the error raised, with its own mapping. Everything else
happens here once: validation and every limit (requests.py), admission and submission to the one batcher,
pooling, `dimensions` and normalisation (replies.py), the model names a request may use, the count of requests
in progress that a drain waits for, and returning memory after large replies. Tokenizing, building a reply and
the door's serialization of it run in the thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass

from attnserve import __version__
from attnserve.config import ServerConfig
from attnserve.engine.engine import Engine
from attnserve.engine.tokenizer import Token

from .batcher import Batcher
from .errors import ModelNotFoundError, ShuttingDownError
from .memory import MemoryReturn
from .replies import EncodeReply, RerankReply, build_reply, build_rerank_reply
from .requests import (
    DecodeRequest,
    EncodeRequest,
    PreparedRequest,
    RequestLimits,
    RerankRequest,
    TokenizeRequest,
    prepare,
    prepare_decode,
    prepare_rerank,
    prepare_tokenize,
)

# A reply's float on a binary wire (protobuf, numpy bytes): what the reply size limit counts by default.
BINARY_FLOAT_BYTES = 4.0


@dataclass(frozen=True)
class ModelInfo:
    """The model and the server's limits, as every door describes them."""

    model: str
    names: tuple[str, ...]  # the model's name and the aliases a request may use for it
    hidden_size: int
    num_layers: int
    num_heads: int
    max_seq_length: int
    vocab_size: int
    pooling: str
    normalize: bool
    provider: str
    precision: str
    version: str
    max_inputs_per_request: int
    max_batch_tokens: int
    max_batch_size: int
    max_queue_tokens: int
    max_request_bytes: int
    max_response_bytes: int
    max_wait_ms: float
    max_queue_wait_ms: float
    kind: str = "embedder"  # or "reranker" (manifest.kind)
    num_labels: int = 0  # a reranker's scores per pair


class Core:
    def __init__(self, engine: Engine, batcher: Batcher, config: ServerConfig, executor: Executor):
        self.engine, self._batcher, self._executor = engine, batcher, executor
        self.limits = RequestLimits(config.max_inputs_per_request, config.max_response_bytes)
        m, batch = engine.manifest, batcher.limits
        self.info = ModelInfo(
            model=m.model, names=tuple(dict.fromkeys((m.model, *config.served_model_name))),
            hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
            max_seq_length=m.max_seq_length, vocab_size=m.vocab_size, pooling=m.pooling, normalize=m.normalize,
            provider=engine.provider, precision=engine.precision, version=__version__,
            max_inputs_per_request=config.max_inputs_per_request, max_batch_tokens=batch.max_batch_tokens,
            max_batch_size=batch.max_batch_size, max_queue_tokens=batch.max_queue_tokens,
            max_request_bytes=config.max_request_bytes, max_response_bytes=config.max_response_bytes,
            max_wait_ms=batch.max_wait_s * 1e3, max_queue_wait_ms=batch.max_queue_wait_s * 1e3, kind=m.kind,
            num_labels=m.num_labels)
        self._memory = MemoryReturn(executor)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_call = time.monotonic()
        self._warm = False
        self.draining = asyncio.Event()

    # --- what a request may ask for -----------------------------------------

    def check_model(self, name: str) -> None:
        if name not in self.info.names:
            raise ModelNotFoundError(f"the model {name!r} does not exist here; this server serves "
                                     + ", ".join(repr(n) for n in self.info.names))

    def check_open(self) -> None:
        """Refuse new requests once the drain began."""
        if self.draining.is_set():
            raise ShuttingDownError("the server is shutting down; retry on another replica")

    # --- the work -----------------------------------------------------------

    async def encode(self, request: EncodeRequest, deadline: float | None, render: Callable[[EncodeReply], bytes],
                     float_bytes: float = BINARY_FLOAT_BYTES) -> tuple[bytes, int]:
        """One request through validation, tokenizer, batcher and reply; render is the door's serializer.

        deadline: a time.monotonic() value, or None. float_bytes: what one float of the reply costs on the
        door's wire, for the reply size limit. Returns (the rendered reply, the request's tokens).
        """
        loop = asyncio.get_running_loop()
        engine = self.engine
        self.check_open()
        body = b""
        self._memory.busy()
        try:
            self._batcher.check_room(len(request.inputs))  # a full queue costs no tokenizing
            prepared = await loop.run_in_executor(
                self._executor, prepare, request, engine.tokenizer, engine.manifest, self.limits, float_bytes,
                engine.takes_token_types)
            rows = await self._batcher.submit(prepared.inputs, prepared.options.attention, deadline)
            body = await loop.run_in_executor(self._executor, self._render, rows, prepared, render)
            return body, prepared.tokens
        finally:
            self._memory.done(len(body))

    def _render(self, rows, prepared: PreparedRequest, render: Callable[[EncodeReply], bytes]) -> bytes:
        return render(build_reply(rows, prepared.inputs, prepared.options, self.engine.tokenizer))

    def _model(self, name: str | None) -> tuple[Engine, Batcher]:
        """The engine and batcher of the request's model: the one place a request's model is resolved (one model
        per server for now; helper multi's registry takes over here)."""
        if name is not None:
            self.check_model(name)
        return self.engine, self._batcher

    async def rerank(self, request: RerankRequest, deadline: float | None) -> RerankReply:
        """Score (query, text) pairs with a reranker through the same batcher as embeddings, sorted best first.

        deadline: a time.monotonic() value, or None."""
        loop = asyncio.get_running_loop()
        engine, batcher = self._model(request.model)
        self.check_open()
        self._memory.busy()
        try:
            batcher.check_room(len(request.texts))  # a full queue costs no tokenizing
            prepared = await loop.run_in_executor(
                self._executor, prepare_rerank, request, engine.tokenizer, engine.manifest, self.limits,
                engine.takes_token_types)
            rows = await batcher.submit(prepared.inputs, False, deadline)
            return build_rerank_reply(rows, prepared, engine.manifest.score_activation)
        finally:
            self._memory.done(0)

    async def tokenize(self, request: TokenizeRequest) -> list[list[Token]]:
        self.check_open()
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, prepare_tokenize, request, self.engine.tokenizer, self.limits)

    async def decode(self, request: DecodeRequest) -> list[str]:
        self.check_open()
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, prepare_decode, request, self.engine.tokenizer, self.limits)

    # --- serving state and requests in progress, for the drain ----------------

    def warmed_up(self) -> None:
        self._warm = True

    @property
    def serving(self) -> bool:
        """Warmed up and not draining: what health checks report."""
        return self._warm and not self.draining.is_set()

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Around every request a door takes: the drain waits until none is in progress."""
        self._in_flight += 1
        self._last_call = time.monotonic()
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    def drain(self) -> None:
        """Shutdown began: new requests are refused; open gRPC streams answer what they hold, then end."""
        self.draining.set()

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
