"""Request bytes of every method of every service: bounded in size and parsed where the answer is ours; and
replies that are bytes already sent as they are.

grpc calls a method's request deserializer and, when it raises, answers UNKNOWN (or, inside a stream, hands
the handler an exception) and logs a traceback; and grpc's own size limit ends a whole stream, the requests
it already accepted unanswered. So one interceptor gives every method a deserializer that never raises: a
message over max_request_bytes, or one that does not parse, becomes a Refused value, and the method's handler
is wrapped so that it answers it with the error's status and details (server/grpc/status.py):

  * unary request (Embed, GetModelInfo, health Check and Watch): the call ends with that status at once;
  * request stream (EmbedStream, reflection): the handler's request iterator raises the error where the
    message stood, so the replies already due go out first. EmbedStream answers it itself, naming the
    request's index; a handler that lets it escape (reflection) gets it answered here.

grpc's core keeps a limit of its own, CORE_LIMIT_FACTOR times higher, to bound the memory a message in flight
can take before it reaches us.

The encoder service's Embed and EmbedStream serialize their replies in the core's thread pool, off the event
loop, and hand grpc bytes; the generated registration gives them EmbedResponse.SerializeToString, which cannot
take bytes. Since every handler passes through here, the guard gives each a serializer that sends bytes as
they are (already_serialized).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import aclosing

import grpc
from google.protobuf.message import DecodeError

from attnserve.errors import MalformedMessageError, MessageTooLargeError

from ..sizes import human_size
from .status import abort, status_for

# grpc's core reads a message whole before its deserializer sees it, and refuses one over its limit by ending
# the call. At 4x max_request_bytes a message somewhat over the limit (a client's estimate off by a little) is
# still answered by us, on its own, while one message in flight holds at most 4x the limit (16 MiB by default).
CORE_LIMIT_FACTOR = 4
_GRPC_INT_MAX = 2**31 - 1  # grpc's channel arguments are C ints


def core_receive_limit(max_request_bytes: int) -> int:
    """grpc's grpc.max_receive_message_length for a server whose own limit is max_request_bytes."""
    return min(CORE_LIMIT_FACTOR * max_request_bytes, _GRPC_INT_MAX)


class Refused:
    """What a guarded deserializer returns for bytes it will not hand on: the error to answer them with."""

    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


class RequestGuard(grpc.aio.ServerInterceptor):
    """Guards the request messages of every method served; refused(method, code) counts each refusal that
    ends a call here (EmbedStream counts its own)."""

    def __init__(self, max_request_bytes: int, refused: Callable[[str, grpc.StatusCode], None]):
        self._max_bytes, self._refused = max_request_bytes, refused
        # Each method's handler as guarded, made once: the same registered handler comes back for every call (a
        # refusing one, new for each call the key check refuses, is guarded anew).
        self._guarded_handlers: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:  # no such method: grpc answers UNIMPLEMENTED
            return None
        known = self._guarded_handlers.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        guarded = self._guarded(handler, details.method)
        self._guarded_handlers[details.method] = (handler, guarded)
        return guarded

    def _deserializer(self, parse: Callable[[bytes], object] | None) -> Callable[[bytes], object]:
        limit = self._max_bytes

        def deserialize(raw: bytes):
            if len(raw) > limit:
                return Refused(MessageTooLargeError(
                    f"the request message is {human_size(len(raw))}, over this server's max_request_bytes "
                    f"({human_size(limit)}); send fewer or shorter inputs per request"))
            if parse is None:
                return raw
            try:
                return parse(raw)
            except DecodeError as e:  # every way protobuf bytes can be bad: corrupt, truncated, bad UTF-8
                return Refused(MalformedMessageError(f"the request message does not parse: {e}"))

        return deserialize

    def _guarded(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        deserialize = self._deserializer(handler.request_deserializer)
        serialize = already_serialized(handler.response_serializer)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._stream_request(handler.stream_stream, method), deserialize, serialize)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._stream_request(handler.stream_unary, method), deserialize, serialize)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_request(handler.unary_stream, method), deserialize, serialize)
        return grpc.unary_unary_rpc_method_handler(
            self._unary_request(handler.unary_unary, method), deserialize, serialize)

    async def _refuse(self, context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
        status = status_for(error)
        self._refused(method, status.code)
        await abort(context, status)

    def _unary_request(self, behavior: Callable, method: str) -> Callable:
        """The handler of a method with one request message, answering a refused message itself."""
        if inspect.isasyncgenfunction(behavior):
            async def replies(request, context):
                if isinstance(request, Refused):
                    await self._refuse(context, request.error, method)
                async with aclosing(behavior(request, context)) as inner:
                    async for reply in inner:
                        yield reply
            return replies
        _require_async(behavior, method)

        async def reply(request, context):
            if isinstance(request, Refused):
                await self._refuse(context, request.error, method)
            return await behavior(request, context)
        return reply

    def _stream_request(self, behavior: Callable, method: str) -> Callable:
        """The handler of a method with a request stream: its iterator raises a refused message's error."""

        async def checked(requests):
            async for request in requests:
                if isinstance(request, Refused):
                    raise request.error
                yield request

        def refused_error(error: BaseException) -> bool:
            return isinstance(error, (MalformedMessageError, MessageTooLargeError))

        if inspect.isasyncgenfunction(behavior):
            async def replies(requests, context):
                try:
                    async with aclosing(behavior(checked(requests), context)) as inner:
                        async for reply in inner:
                            yield reply
                except Exception as error:
                    if not refused_error(error):
                        raise
                    await self._refuse(context, error, method)
            return replies
        _require_async(behavior, method)

        async def reply(requests, context):
            try:
                return await behavior(checked(requests), context)
            except Exception as error:
                if not refused_error(error):
                    raise
                await self._refuse(context, error, method)
        return reply


def already_serialized(serialize: Callable[[object], bytes] | None) -> Callable[[object], bytes] | None:
    """The method's serializer, except that a reply that is bytes already goes out as it is."""
    if serialize is None:
        return None

    def reply_bytes(reply) -> bytes:
        return reply if isinstance(reply, bytes) else serialize(reply)

    return reply_bytes


def _require_async(behavior: Callable, method: str) -> None:
    if not inspect.iscoroutinefunction(behavior):
        raise TypeError(f"{method}: the server serves asyncio handlers only, got {behavior!r}")

