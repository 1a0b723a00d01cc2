"""The gRPC side of the API key check: one interceptor in front of every method but the health service's.

A call without a valid key never reaches its handler: its request bytes are not even parsed, and it ends at
once with UNAUTHENTICATED and its details (server/grpc/status.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from attnserve.errors import UnauthenticatedError

from ..auth import ApiKeys
from .kserve import OPEN_METHODS as KSERVE_OPEN_METHODS
from .status import abort, status_for

# Health stays open, so probes and load balancers need no key: the health service, and KServe's liveness and
# readiness (as HTTP's /v2/health/*).
OPEN_SERVICES = ("/grpc.health.v1.Health/", *KSERVE_OPEN_METHODS)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """refused(method, code) counts each call refused here."""

    def __init__(self, keys: ApiKeys, refused: Callable[[str, grpc.StatusCode], None]):
        self._keys, self._refused = keys, refused

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if not self._keys.required or details.method.startswith(OPEN_SERVICES):
            return await continuation(details)
        authorization = next((value for key, value in details.invocation_metadata or ()
                              if key == "authorization"), None)
        try:
            self._keys.check(authorization if isinstance(authorization, str) else None)
        except UnauthenticatedError as error:
            handler = await continuation(details)
            return None if handler is None else self._refusing(handler, error, details.method)
        return await continuation(details)

    def _refusing(self, handler: grpc.RpcMethodHandler, error: UnauthenticatedError, method: str
                  ) -> grpc.RpcMethodHandler:
        """A handler of the same kind as handler's that answers every call with error."""
        status = status_for(error)

        async def refuse(request, context):
            self._refused(method, status.code)
            await abort(context, status)

        async def refuse_stream(request, context):
            await refuse(request, context)
            yield  # an async generator, as a response-streaming handler must be

        def ignore(raw: bytes) -> None:
            return None

        kind = {(False, False): grpc.unary_unary_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}
        behavior = refuse_stream if handler.response_streaming else refuse
        return kind[(handler.request_streaming, handler.response_streaming)](
            behavior, request_deserializer=ignore, response_serializer=handler.response_serializer)
