"""The HTTP header timeout aiohttp lacks: a client has http_header_timeout seconds to send a request's whole head,
counted from the connection's opening or from the first byte of the request, else it gets a 408 and the
connection closes. Without it, a slowloris client that sends a header byte now and then holds its connection and
its buffers for aiohttp's keep-alive timeout, and many such clients hold them all.

aiohttp has a hook for neither the head's arrival nor the connection's bytes, so each connection's protocol (the
RequestHandler aiohttp makes) is wrapped: the wrapper sees the bytes arrive, the door's middleware says when a
head was complete (head_complete, as a request reaches it) and when its reply was sent (request_done). The body's
own timeout is the BodyReader's; idle kept-alive connections are closed by aiohttp's keepalive_timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from yarl import URL


class HeadTimeouts:
    def __init__(self, seconds: float, reply: Callable[[], bytes]):
        """reply: the whole HTTP response a late client gets before its connection closes."""
        self.seconds, self.reply = seconds, reply
        self._watched: dict[asyncio.BaseTransport, _Watched] = {}

    def head_complete(self, request: web.BaseRequest) -> None:
        watched = self._watched.get(request.transport) if request.transport is not None else None
        if watched is not None:
            watched.in_request = True
            watched.disarm()

    def request_done(self, request: web.BaseRequest) -> None:
        watched = self._watched.get(request.transport) if request.transport is not None else None
        if watched is not None:
            watched.in_request = False  # the next byte starts the next head's clock

    def site(self, runner: web.BaseRunner, host: str, port: int, ssl_context,
             protocol: Callable[[RequestHandler], RequestHandler] = lambda handler: handler,
             reuse_port: bool = False) -> web.BaseSite:
        """A TCP site whose connections are watched; `protocol` adapts each connection's aiohttp protocol first.
        reuse_port: the port is shared with the other workers of `serve --workers N` (SO_REUSEPORT)."""
        return _Site(runner, host, port, ssl_context, self, protocol, reuse_port)


class _Watched(asyncio.Protocol):
    """aiohttp's protocol for one connection, every call passed on, with the head's clock beside it."""

    def __init__(self, inner: asyncio.Protocol, timeouts: HeadTimeouts):
        self._inner, self._timeouts = inner, timeouts
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.in_request = False

    def arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._timeouts.seconds, self._expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or self.in_request or transport.is_closing():
            return
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._timeouts.reply())  # no request is being answered: the head never came whole
        transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._timeouts._watched[transport] = self
        self.arm()  # an open connection owes its first head
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self._transport is not None:
            self._timeouts._watched.pop(self._transport, None)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.in_request:
            self.arm()  # the first byte of a head (or more of one already on the clock)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _Site(web.BaseSite):
    """web.TCPSite's listener, with each connection's protocol watched."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, ssl_context, timeouts: HeadTimeouts,
                 protocol: Callable[[RequestHandler], RequestHandler], reuse_port: bool):
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._timeouts, self._protocol = host, port, timeouts, protocol
        self._reuse_port = reuse_port

    @property
    def name(self) -> str:
        return str(URL.build(scheme="https" if self._ssl_context else "http", host=self._host, port=self._port))

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # set by runner.setup()
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Watched(self._protocol(server()), self._timeouts), self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, reuse_address=True, reuse_port=self._reuse_port)
