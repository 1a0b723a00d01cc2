"""The HTTP door: an aiohttp server in the gRPC server's event loop, over the same core, batcher, TLS and drain.

One middleware stands in front of every route. It answers a path or method that does not exist, checks the API
key (every route but /health), refuses new requests once the drain began, counts the request in progress for
the drain, maps any error through errors.http_error in the route's envelope, reads past a body the route left
unread (or marks the reply `Connection: close` where it cannot), and records the request's metric and log line
(protocol "http", the route's path as the method). Every GET route answers HEAD too; a 405 says in `Allow` what
the path takes.

Clients' protocol mistakes never reach the log as tracebacks or raw bytes (protocol_log.py), and slow clients are
cut off: the head by head_timeout.py, the body by BodyReader, idle connections by aiohttp's keep-alive timeout.

aiohttp was chosen by measurement (docs/performance.md, The HTTP stack): it embeds in grpc.aio's loop without taking
over signals, answers 413 itself at client_max_size, and served an OpenAI-shaped request in about 50 us against
FastAPI's 170 us. A client that disconnects cancels its handler, which drops its queued inputs, as over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from concurrent.futures import Executor
from functools import partial

from aiohttp import HttpVersion11, web
from opentelemetry import trace

from attnserve.config import ServerConfig
from attnserve.errors import (
    MessageTooLargeError,
    MethodNotAllowedError,
    RequestTimeoutError,
    RouteNotFoundError,
    UnauthenticatedError,
)

from .. import tracing
from ..auth import ApiKeys
from ..core import Core
from ..metrics import Metrics
from .attention import AttentionRoutes
from .cohere import CohereRoutes
from .errors import OPENAI, TEI, http_error
from .explorer import ExplorerRoutes
from .head_timeout import HeadTimeouts
from .kserve import KServeRoutes
from .late_chunking import LateChunkingRoutes
from .multi_vector import MultiVectorRoutes
from .openai import OpenAIRoutes
from .openapi import index, openapi_spec
from .parse_errors import answer_in_envelope
from .protocol_log import ProtocolLog
from .rerank import RerankRoutes
from .route import Route, families
from .tei import TeiRoutes
from .wire import BODY_INVITED, BodyReader, ClientGoneError, dumps, json_response
from .zero_shot import ZeroShotRoutes

log = logging.getLogger("attnserve.server")
_TRACER = tracing.tracer()

PROTOCOL = "http"
# The status of a request whose client went away before its answer (nginx's convention): counted, never sent.
CLIENT_CLOSED = 499
# Label of requests that matched no route: one label, whatever the path, so that a scan cannot blow up the metrics.
UNMATCHED = "unmatched"


class HttpDoor:
    def __init__(self, core: Core, metrics: Metrics, keys: ApiKeys, config: ServerConfig, executor: Executor):
        self._core, self._metrics, self._keys, self._config = core, metrics, keys, config
        self._bodies = bodies = BodyReader(executor, config.max_request_bytes, config.http_body_timeout)
        self.routes: list[Route] = [*OpenAIRoutes(core, bodies).routes(), *TeiRoutes(core, bodies).routes(),
                                    *AttentionRoutes(core, bodies).routes(), *RerankRoutes(core, bodies).routes(),
                                    *KServeRoutes(core, bodies).routes(), *CohereRoutes(core, bodies).routes(),
                                    *MultiVectorRoutes(core, bodies).routes(),
                                    *LateChunkingRoutes(core, bodies).routes(), *ZeroShotRoutes(core, bodies).routes(),
                                    *ExplorerRoutes().routes(),
                                    Route("GET", "/openapi.json", self._openapi, OPENAI, "this description",
                                          reply_schema={"type": "object"}),
                                    Route("GET", "/", self._index, TEI, "where to start: the help and the routes",
                                          reply_schema={"type": "object"}, open=True)]
        self._spec = dumps(openapi_spec(
            self.routes, core.info, keys.required, {output for m in core.models.all for output in m.info.outputs},
            [name for m in core.models.all for name in m.info.names]))
        self._index_body = dumps(index(self.routes, core.info.version))
        self._by_handler = {route.handler: route for route in self.routes}
        self._families = families(self.routes)
        self.app = web.Application(client_max_size=config.max_request_bytes, middlewares=[self._middleware])
        for route in self.routes:
            # add_get also answers HEAD, as RFC 9110 asks of every GET route (balancers probe with it).
            add = self.app.router.add_get if route.method == "GET" else partial(self.app.router.add_route, route.method)
            add(route.path, route.handler, expect_handler=partial(self._expect, route))
        self._heads = HeadTimeouts(config.http_header_timeout, self._head_timeout_reply)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None,
                    shutdown_timeout: float, reuse_port: bool = False) -> int:
        """Listen; returns the port bound. reuse_port: shared with the other workers of `serve --workers N`."""
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=shutdown_timeout, logger=ProtocolLog(log),
                                     keepalive_timeout=self._config.http_keepalive_timeout)
        await self._runner.setup()
        await self._heads.site(self._runner, host.strip("[]"), port, ssl_context, answer_in_envelope,
                               reuse_port).start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        """Stop listening and close the connections (the drain has let the requests in flight finish)."""
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        start, status = time.perf_counter(), 500
        self._heads.head_complete(request)
        match = request.match_info
        route = None if match.http_exception is not None else self._by_handler.get(match.handler)
        resource = match.route.resource  # None only for aiohttp's own routes (404, 405), which match no Route
        label = resource.canonical if route is not None and resource is not None else UNMATCHED
        style = route.style if route is not None else self._families.get(_first_segment(request.path), TEI)
        try:
            try:
                if route is None:
                    refusal = match.http_exception
                    raise (MethodNotAllowedError(f"{request.method} is not allowed on {request.path}",
                                                 allowed=tuple(sorted(refusal.allowed_methods)))
                           if isinstance(refusal, web.HTTPMethodNotAllowed)
                           else RouteNotFoundError(f"no route {request.path}; GET / and /openapi.json list them"))
                if route.open:  # not counted: a balancer's health checks must not hold up the drain
                    response = await self._answer(route, handler, request, label)
                else:
                    self._keys.check(request.headers.get("Authorization"))
                    with self._core.in_flight():  # refusals too: the drain waits for late arrivals to stop
                        self._core.check_open()
                        response = await self._answer(route, handler, request, label)
            except asyncio.CancelledError:
                status = CLIENT_CLOSED
                raise
            except ClientGoneError as gone:  # the client's network trouble, not the server's: no traceback
                status = CLIENT_CLOSED
                log.info("client disconnected", extra={"fields": {
                    "event": "client_disconnected", "protocol": PROTOCOL, "method": label, "peer": request.remote,
                    "detail": str(gone)}})
                response = web.Response(status=CLIENT_CLOSED)  # nobody reads it: aiohttp drops it quietly
                response.force_close()
                return response
            except Exception as e:  # every error becomes the route's envelope
                error = http_error(e, style, route.names if route is not None else None)
                response = json_response(error.body, error.status, error.headers)
                if isinstance(e, (MessageTooLargeError, RequestTimeoutError)):
                    response.force_close()  # the rest of the body is not worth waiting for
            # A body the route left unread (an error came first, or a GET had one) is read past, so that the
            # connection can take its next request; where that cannot be (too large, too slow, not decoding), the
            # reply says the connection closes, rather than closing it under the client's next request.
            if response.keep_alive is not False and not await self._bodies.discard(request):
                response.force_close()
            if self._core.draining.is_set():
                # The connection closes with this reply, so that the client's next request goes out on a new one,
                # which the drain refuses (503) or the closed port turns away before a byte is sent, never on a
                # kept-alive one that the listener's close cuts under it.
                response.force_close()
            status = response.status
            return response
        finally:
            self._heads.request_done(request)
            self._record(request, label, status, start)

    def _head_timeout_reply(self) -> bytes:
        error = http_error(RequestTimeoutError(f"the request's head did not arrive within "
                                               f"{self._config.http_header_timeout:g} s (the server's "
                                               "http_header_timeout)"), TEI)
        return (b"HTTP/1.1 %d Request Timeout\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (error.status, len(error.body), error.body))

    async def _expect(self, route: Route, request: web.Request) -> None:
        """`Expect: 100-continue`: invite the body only of a request the route will read. aiohttp's own handler
        invites every body, so a client sent 100 Continue began uploading a body over max_request_bytes, or one
        without a valid key, before its 413 or 401 came. Without the 100, the middleware answers the refusal
        before a byte of the body is sent (RFC 9110 10.1.1). Another expectation is ignored, as RFC 9110 allows
        (aiohttp's 417 for it was text/plain, outside every envelope)."""
        if request.headers.get("Expect", "").lower() != "100-continue" or request.version != HttpVersion11:
            return
        if (request.content_length or 0) > self._config.max_request_bytes:
            return
        if not route.open:
            try:
                self._keys.check(request.headers.get("Authorization"))
            except UnauthenticatedError:
                return
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the reply proper has not begun (as aiohttp's own handler resets it)
        request[BODY_INVITED] = True

    async def _index(self, request: web.Request) -> web.Response:
        """A browser (one that accepts HTML) is sent to the explorer; curl and clients get the JSON."""
        if "text/html" in request.headers.get("Accept", ""):
            # relative, so that it holds behind a proxy that serves this server under a path prefix
            return web.Response(status=302, headers={"Location": "explorer"})
        return json_response(self._index_body)

    async def _answer(self, route: Route, handler, request: web.Request, path: str) -> web.StreamResponse:
        """The route's handler; a readiness probe (Route.readiness) is 503 unless the core is ready."""
        if route.readiness:
            self._core.check_ready()
        if route.open or not tracing.enabled():  # probes are not traced
            return await handler(request)
        # The caller's traceparent, if any, makes this span its child (server/tracing.py). path: as routed (a
        # handler may serve several: /v1/embeddings and /embeddings), the metrics' label.
        with tracing.incoming(lambda: request.headers), _TRACER.start_as_current_span(
                f"{request.method} {path}", kind=trace.SpanKind.SERVER, attributes={
                    "http.request.method": request.method, "http.route": path,
                    "attnserve.protocol": PROTOCOL}) as span:
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            return response

    async def _openapi(self, request: web.Request) -> web.Response:
        return json_response(self._spec)

    def _record(self, request: web.Request, label: str, status: int, start: float) -> None:
        seconds = time.perf_counter() - start
        self._metrics.observe_request(PROTOCOL, label, str(status), seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request", extra={"fields": {
                "event": "request", "protocol": PROTOCOL, "method": label, "http_method": request.method,
                "code": status, "ms": round(seconds * 1e3, 2), "peer": request.remote}})


def _first_segment(path: str) -> str:
    return path.lstrip("/").partition("/")[0]
