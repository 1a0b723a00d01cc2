"""The API key on every call of a channel: `authorization: Bearer KEY` metadata, added by a client interceptor
(sync and asyncio), so that stubs, streams and every tool built on open_channel send it without knowing."""

from __future__ import annotations

import collections

import grpc


def authorization(api_key: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {api_key}")


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class ApiKeyInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """For grpc.intercept_channel."""

    def __init__(self, api_key: str):
        self._header = authorization(api_key)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(details.method, details.timeout, [*(details.metadata or ()), self._header],
                            details.credentials, details.wait_for_ready, getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class AioApiKeyInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
                           grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor):
    """For grpc.aio channels' interceptors."""

    def __init__(self, api_key: str):
        self._header = authorization(api_key)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(details.method, details.timeout,
                                          grpc.aio.Metadata(*(details.metadata or ()), self._header),
                                          details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, requests):
        return await continuation(self._details(details), requests)

    async def intercept_stream_stream(self, continuation, details, requests):
        return await continuation(self._details(details), requests)
