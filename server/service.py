"""The attnserve.v1.Encoder servicer: validate -> batcher -> reply. No batching or model logic lives here.

Tokenization and reply serialization run in a thread pool, never on the event
loop; Embed and EmbedStream therefore hand grpc already-serialized bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import grpc

from attnserve import __version__
from attnserve.config import ServerConfig
from attnserve.engine.engine import Engine
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .batcher import Batcher
from .errors import ShuttingDownError, abort, status_for
from .memory import MemoryReturn
from .metrics import Metrics
from .requests import prepare
from .responses import serialize_reply

log = logging.getLogger("attnserve.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Encoder"].full_name  # "attnserve.v1.Encoder"

# Requests of one stream in flight at once: enough to fill batches from a
# single streaming client, bounded so a fast sender cannot queue without limit.
STREAM_WINDOW = 64


class EncoderService(encoder_pb2_grpc.EncoderServicer):
    def __init__(self, engine: Engine, batcher: Batcher, config: ServerConfig, metrics: Metrics, executor: Executor):
        self._engine, self._batcher, self._config = engine, batcher, config
        self._metrics, self._executor = metrics, executor
        self._memory = MemoryReturn(executor)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_call = time.monotonic()
        self._draining = asyncio.Event()

    def drain(self) -> None:
        """Shutdown began: open streams answer what they hold, then end with UNAVAILABLE."""
        self._draining.set()

    async def _next(self, window: asyncio.Queue):
        """The stream's next item, or ShuttingDownError once draining leaves nothing to answer."""
        if not window.empty():
            return window.get_nowait()
        get, drain = asyncio.ensure_future(window.get()), asyncio.ensure_future(self._draining.wait())
        await asyncio.wait((get, drain), return_when=asyncio.FIRST_COMPLETED)
        drain.cancel()
        if get.done():
            return get.result()
        get.cancel()
        raise ShuttingDownError("the server is shutting down; reopen the stream on another replica")

    async def wait_quiet(self, timeout: float, quiet: float) -> bool:
        """Until no Embed or EmbedStream call is in progress and none began for `quiet` seconds.

        False if timeout passed first.
        """
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

    def _enter(self) -> None:
        self._in_flight += 1
        self._last_call = time.monotonic()
        self._idle.clear()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> bytes:
        start, code, tokens = time.perf_counter(), grpc.StatusCode.OK, 0
        self._enter()
        try:
            reply, tokens = await self._embed(request, context)
            return reply
        except asyncio.CancelledError:
            code = _cancel_code(context)
            raise
        except Exception as error:
            status = status_for(error)
            code = status.code
            await abort(context, status)
        finally:
            self._leave()
            self._record("Embed", code, start, len(request.inputs), tokens, context)

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest], context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[bytes]:
        """Requests are taken as they come and run concurrently; replies go back in request order.

        An error ends the stream after the replies to the requests before it, naming the request it answers.
        """
        start, code, answered, tokens = time.perf_counter(), grpc.StatusCode.OK, 0, 0
        window: asyncio.Queue = asyncio.Queue(STREAM_WINDOW)

        async def read() -> None:
            try:
                async for request in requests:
                    await window.put(asyncio.ensure_future(self._embed(request, context)))
                await window.put(None)
            except Exception as error:  # a message refused (server/wire.py), or the client's stream broke
                await window.put(error)

        self._enter()
        reader = asyncio.ensure_future(read())
        item, index = None, None
        try:
            while True:
                index = None  # draining while the stream is idle answers no request
                if (item := await self._next(window)) is None:
                    break
                index = answered  # replies go in order: the item is the answered-th request
                if isinstance(item, BaseException):
                    raise item
                reply, n = await item
                tokens += n
                answered += 1
                yield reply
        except asyncio.CancelledError:
            code = _cancel_code(context)
            raise
        except Exception as error:
            status = status_for(error, index)
            code = status.code
            await abort(context, status)
        finally:
            reader.cancel()
            _discard(item)  # the request being awaited when the stream ended early
            while not window.empty():
                _discard(window.get_nowait())
            self._leave()
            self._record("EmbedStream", code, start, answered, tokens, context)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        m, engine, config, limits = self._engine.manifest, self._engine, self._config, self._batcher.limits
        self._metrics.requests.labels("GetModelInfo", "OK").inc()
        return pb.ModelInfo(
            model=m.model, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
            max_seq_length=m.max_seq_length, vocab_size=m.vocab_size, pooling=m.pooling, normalize=m.normalize,
            provider=engine.provider, precision=engine.precision, version=__version__,
            limits=pb.ServerLimits(
                max_inputs_per_request=config.max_inputs_per_request, max_batch_tokens=limits.max_batch_tokens,
                max_batch_size=limits.max_batch_size, max_queue_tokens=limits.max_queue_tokens,
                max_request_bytes=config.max_request_bytes, max_response_bytes=config.max_response_bytes,
                max_wait_ms=limits.max_wait_s * 1e3, max_queue_wait_ms=limits.max_queue_wait_s * 1e3))

    async def _embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> tuple[bytes, int]:
        """One request through tokenizer, batcher and serializer: (serialized reply, its token count)."""
        loop = asyncio.get_running_loop()
        engine = self._engine
        reply = b""
        self._memory.busy()
        try:
            self._batcher.check_room(len(request.inputs))  # a full queue costs no tokenizing
            prepared = await loop.run_in_executor(
                self._executor, prepare, request, engine.tokenizer, engine.manifest,
                self._config.max_inputs_per_request, self._config.max_response_bytes)
            remaining = context.time_remaining()
            deadline = time.monotonic() + remaining if remaining is not None else None
            rows = await self._batcher.submit(prepared.inputs, prepared.options.attention, deadline)
            reply = await loop.run_in_executor(
                self._executor, serialize_reply, rows, prepared.inputs, prepared.options, engine.tokenizer,
                engine.manifest.model)
            return reply, sum(len(x) for x in prepared.inputs)
        finally:
            self._memory.done(len(reply))

    def _record(self, method: str, code: grpc.StatusCode, start: float, inputs: int, tokens: int,
                context: grpc.aio.ServicerContext) -> None:
        seconds = time.perf_counter() - start
        self._metrics.requests.labels(method, code.name).inc()
        self._metrics.request_seconds.labels(method).observe(seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request", extra={"fields": {
                "event": "request", "method": method, "code": code.name, "inputs": inputs, "tokens": tokens,
                "ms": round(seconds * 1e3, 2), "peer": context.peer()}})


def _cancel_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    remaining = context.time_remaining()
    return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else grpc.StatusCode.CANCELLED


def _discard(item) -> None:
    """Cancel a stream's request that will not be answered, and collect its error so none is logged as lost."""
    if isinstance(item, asyncio.Future):
        if item.done() and not item.cancelled():
            item.exception()
        item.cancel()


def _passthrough(reply: bytes) -> bytes:
    return reply


def rpc_handlers(service: EncoderService) -> grpc.GenericRpcHandler:
    """Like the generated add_EncoderServicer_to_server, except that Embed and EmbedStream return bytes."""
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Embed": grpc.unary_unary_rpc_method_handler(
            service.Embed, request_deserializer=pb.EmbedRequest.FromString, response_serializer=_passthrough),
        "EmbedStream": grpc.stream_stream_rpc_method_handler(
            service.EmbedStream, request_deserializer=pb.EmbedRequest.FromString, response_serializer=_passthrough),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            service.GetModelInfo, request_deserializer=pb.GetModelInfoRequest.FromString,
            response_serializer=pb.ModelInfo.SerializeToString),
    })
