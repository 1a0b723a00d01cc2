"""What every call of attnserve's gRPC services goes through, whichever service (attnserve.v1's, KServe's,
TEI's): counted in flight for the drain, its error mapped to a status (status.py), recorded in the metrics under its
protocol; a stream's requests answered concurrently, its replies in order."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NoReturn

import grpc
from opentelemetry import trace

from attnserve.errors import ShuttingDownError

from .. import tracing
from ..core import Core
from ..metrics import Metrics
from ..requests import Deadline
from .status import abort, status_for

log = logging.getLogger("attnserve.server")
_TRACER = tracing.tracer()
# How far a stream's answers may run ahead of its replies.
STREAM_WINDOW = 64


class Calls:
    """protocol: the metrics' label ("grpc", "kserve-grpc"); request_types: each method's request message, which
    an error's fix may name; truncate_how: how the service's requests ask for truncation, when not by a field."""

    def __init__(self, core: Core, metrics: Metrics, protocol: str, request_types: dict[str, str],
                 truncate_how: str | None = None):
        self._core, self._metrics, self.protocol = core, metrics, protocol
        self._request_types, self._truncate_how = request_types, truncate_how

    async def unary(self, method: str, inputs: int, context: grpc.aio.ServicerContext,
                    answer: Callable[[], Awaitable[tuple[Any, int]]]) -> Any:
        """One unary call; answer() gives (the reply, the tokens it cost)."""
        call = _Recorded(self, method, inputs, context)
        with self._core.in_flight(), self._span(method, context):
            try:
                reply, call.tokens = await answer()
                return call.deliverable(reply)
            except (asyncio.CancelledError, Exception) as error:
                await call.failed(error)
            finally:
                call.write()

    async def stream(self, method: str, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext,
                     answer: Callable[[Any], Awaitable[tuple[Any, int]]]) -> AsyncIterator[Any]:
        """A bidirectional stream: requests are taken as they come and answered concurrently (up to STREAM_WINDOW
        ahead of the replies); replies go back in request order. answer(request) gives (its reply, the tokens it
        cost). An error ends the stream after the replies to the requests before it, naming the request it
        answers; the drain ends an idle stream, and a busy one once its requests are answered."""
        call = _Recorded(self, method, 0, context)  # inputs: the requests answered so far
        window: asyncio.Queue = asyncio.Queue(STREAM_WINDOW)

        async def read() -> None:
            try:
                async for request in requests:
                    answering = asyncio.ensure_future(answer(request))
                    try:
                        await window.put(answering)  # waits while the window is full
                    except BaseException:  # the stream ended meanwhile: nobody takes it from the window
                        _discard(answering)
                        raise
                await window.put(None)
            except Exception as error:  # a message refused (server/grpc/guard.py), or the client's stream broke
                await window.put(error)

        with self._core.in_flight(), self._span(method, context):
            reader = asyncio.ensure_future(read())
            item = None
            try:
                while True:
                    call.request_index = None  # draining while the stream is idle answers no request
                    if (item := await self._next(window)) is None:
                        break
                    call.request_index = call.inputs  # replies go in order: the item is the answered-th request
                    if isinstance(item, BaseException):
                        raise item
                    reply, n = await item
                    call.tokens += n
                    call.inputs += 1
                    yield call.deliverable(reply)
            except (asyncio.CancelledError, Exception) as error:
                await call.failed(error)
            finally:
                reader.cancel()
                _discard(item)  # the request being awaited when the stream ended early
                while not window.empty():
                    _discard(window.get_nowait())
                call.write()

    def _span(self, method: str, context: grpc.aio.ServicerContext):
        """The call's server span, the child of the caller's traceparent (gRPC metadata) if it sent one; none where
        spans are not exported."""
        return self._traced(method, context) if tracing.enabled() else tracing.OFF

    @contextlib.contextmanager
    def _traced(self, method: str, context: grpc.aio.ServicerContext) -> Iterator[None]:
        with tracing.incoming(lambda: dict(context.invocation_metadata() or ())), _TRACER.start_as_current_span(
                method, kind=trace.SpanKind.SERVER,
                attributes={"rpc.system": "grpc", "rpc.method": method, "attnserve.protocol": self.protocol}):
            yield

    async def _next(self, window: asyncio.Queue):
        """The stream's next item, or ShuttingDownError once draining leaves nothing to answer."""
        if not window.empty():
            return window.get_nowait()
        get, drain = asyncio.ensure_future(window.get()), asyncio.ensure_future(self._core.draining.wait())
        try:
            await asyncio.wait((get, drain), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the stream was cancelled (client gone, deadline passed) while it waited
            _abandon(get)
            raise
        finally:
            drain.cancel()
        if get.done():
            return get.result()
        get.cancel()
        raise ShuttingDownError("the server is shutting down; reopen the stream on another replica")

    async def quick(self, method: str, context: grpc.aio.ServicerContext, answer: Callable[[], Any]) -> Any:
        """A call answered at once from what the server knows (metadata, readiness, statistics: answer() may be a
        coroutine function): its error mapped, counted untimed."""
        try:
            reply = answer()
            if inspect.isawaitable(reply):
                reply = await reply
        except Exception as error:
            if call_ended(context):
                self._metrics.observe_request(self.protocol, method, cancel_code(context).name)
                _dropped(method, error)
            status = self.status(error, method)
            self._metrics.observe_request(self.protocol, method, status.code.name)
            await end_call(context, status)
        self._metrics.observe_request(self.protocol, method, "OK")
        return reply

    def status(self, error: BaseException, method: str, request_index: int | None = None) -> grpc.Status:
        return status_for(error, request_index, request_type=self._request_types[method],
                          truncate_how=self._truncate_how)

    def record(self, method: str, code: grpc.StatusCode, start: float, inputs: int, tokens: int,
               context: grpc.aio.ServicerContext) -> None:
        seconds = time.perf_counter() - start
        self._metrics.observe_request(self.protocol, method, code.name, seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request", extra={"fields": {
                "event": "request", "protocol": self.protocol, "method": method, "code": code.name, "inputs": inputs,
                "tokens": tokens, "ms": round(seconds * 1e3, 2), "peer": context.peer()}})


class _Recorded:
    """One timed call's entry in the metrics (Calls.record), written once: before an error's status goes out, so
    that a client that saw the error then sees it counted, else as the call ends. inputs and tokens are the call's
    so far; request_index, the stream's request an error answers (None: none)."""

    def __init__(self, calls: Calls, method: str, inputs: int, context: grpc.aio.ServicerContext):
        self._calls, self._method, self._context = calls, method, context
        self._start, self._code, self._written = time.perf_counter(), grpc.StatusCode.OK, False
        self.inputs, self.tokens = inputs, 0
        self.request_index: int | None = None

    def deliverable(self, reply: Any) -> Any:
        """reply, unless grpc has ended the call meanwhile (call_ended): its core would refuse the write, and log
        that at error level; the call then ends cancelled."""
        if call_ended(self._context):
            raise asyncio.CancelledError
        return reply

    async def failed(self, error: Exception | asyncio.CancelledError) -> NoReturn:
        """End the call with error's status; a cancelled call, or one grpc has ended already (call_ended), ends
        cancelled, its code CANCELLED or DEADLINE_EXCEEDED."""
        if isinstance(error, asyncio.CancelledError):
            self._code = cancel_code(self._context)
            raise error
        if call_ended(self._context):
            self._code = cancel_code(self._context)
            _dropped(self._method, error)
        status = self._calls.status(error, self._method, self.request_index)
        self._code = status.code
        self.write()
        await end_call(self._context, status)

    def write(self) -> None:
        if not self._written:
            self._written = True
            self._calls.record(self._method, self._code, self._start, self.inputs, self.tokens, self._context)


def call_ended(context: grpc.aio.ServicerContext) -> bool:
    """Whether grpc has ended the call already: its deadline passed (grpc's core ends the call then, whatever the
    handler does), its status went out, or it was cancelled. Such a call takes no status and no reply: grpc's core
    refuses the write (ExecuteBatchError), and grpc logs that at error level, with a traceback."""
    remaining = context.time_remaining()
    return context.done() or context.cancelled() or (remaining is not None and remaining <= 0)


def _dropped(method: str, error: Exception) -> NoReturn:
    """The error of a call grpc has ended already (call_ended): nobody can read its status, so it ends as a
    cancelled call does, logged at debug (grpc logs a handler's CancelledError at debug too). A deadline that
    passes, or a client that leaves, is no server error."""
    log.debug("%s: the call had ended (deadline or client gone) before its error could be sent: %s: %s", method,
              type(error).__name__, error)
    raise asyncio.CancelledError from error


async def end_call(context: grpc.aio.ServicerContext, status: grpc.Status) -> NoReturn:
    """End the call with status, as abort does; a call grpc ends meanwhile (its deadline passes, its client leaves,
    between call_ended's look and the write) ends as a cancelled one does, as in _dropped."""
    try:
        await abort(context, status)
    except grpc.aio.InternalError as error:  # grpc's ExecuteBatchError: the core refused the status, the call over
        log.debug("the call ended before its status %s could be sent: %s", status.code.name, error)
        raise asyncio.CancelledError from error


def _abandon(get: asyncio.Future) -> None:
    """A window.get() whose stream ended: left pending, it would take the next request's answer from the window and
    hold it, unawaited, its error unread (asyncio logs that at error: "Task exception was never retrieved"). What
    it took already is discarded; what is still in the window the stream's end discards."""
    if get.done():
        if not get.cancelled():
            _discard(get.result())
        return
    get.cancel()


def _discard(item) -> None:
    """Cancel a stream's request that will not be answered, and collect its error whenever it ends, so none is
    logged as lost ("Task exception was never retrieved"). Collected when done, not only now: a request cancelled
    while it runs can still end in an error of its own (the soak saw DeadlineExpiredError from one)."""
    if isinstance(item, asyncio.Future):
        item.cancel()
        item.add_done_callback(_collect)


def _collect(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def deadline(context: grpc.aio.ServicerContext) -> Deadline | None:
    """The call's deadline, or None."""
    remaining = context.time_remaining()
    return Deadline(time.monotonic() + remaining) if remaining is not None else None


def cancel_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    remaining = context.time_remaining()
    return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else grpc.StatusCode.CANCELLED
