"""The standard grpc.health.v1 service, whose Watch streams end on their own when the server stops.

grpc's asyncio HealthServicer keeps every Watch open until grpc's own stop cancels it, and the calls it
cancels are still unwinding when the process ends: grpc then logs each one as an unhandled CancelledError,
a raw traceback in the JSON-lines log. Here, once the server closes the health service, each Watch sends its
last status (NOT_SERVING) and ends with UNAVAILABLE and its details, as any call ended by a drain does, before
grpc stops. List, which grpc's servicer leaves unimplemented, answers every service's status.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2

from attnserve.errors import Reason, ShuttingDownError

from .status import abort, detailed_status, status_for


class _StatusSent:
    """The context a Watch writes through: tells when the last status written is not SERVING."""

    def __init__(self, context: grpc.aio.ServicerContext):
        self._context = context
        self.not_serving = asyncio.Event()

    async def write(self, reply: health_pb2.HealthCheckResponse) -> None:
        await self._context.write(reply)
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            self.not_serving.clear()
        else:
            self.not_serving.set()

    def __getattr__(self, name: str):
        return getattr(self._context, name)


class HealthService(health.aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self._closing = asyncio.Event()
        self._watches = 0
        self._no_watches = asyncio.Event()
        self._no_watches.set()

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
                    ) -> health_pb2.HealthCheckResponse:
        """grpc's Check, whose NOT_FOUND for an unknown service has no message: here it names the services known
        (the health protocol asks for NOT_FOUND itself, not the UNIMPLEMENTED of an unknown method)."""
        if request.service not in self._server_status:
            await abort(context, detailed_status(
                grpc.StatusCode.NOT_FOUND, f"no health status for the service {request.service!r}; the services "
                f"are {', '.join(repr(name) for name in sorted(self._server_status))} ('' is the whole server)",
                Reason.NOT_FOUND))
        return await super().Check(request, context)

    async def List(self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext
                   ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(statuses={
            service: health_pb2.HealthCheckResponse(status=status) for service, status in self._server_status.items()})

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        """grpc's Watch, until the service is closed and the watcher was told the service is not serving."""
        self._watches += 1
        self._no_watches.clear()
        sent = _StatusSent(context)
        watch = asyncio.ensure_future(super().Watch(request, sent))
        closed = asyncio.ensure_future(self._closed_and_told(sent))
        try:
            try:
                done, _ = await asyncio.wait((watch, closed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (watch, closed):
                    task.cancel()
                await asyncio.gather(watch, closed, return_exceptions=True)
            if watch in done:  # it ended by itself (the client went away): as it ended
                return watch.result()
            await abort(context, status_for(ShuttingDownError(
                "the server is shutting down; watch another replica")))
        finally:
            self._watches -= 1
            if self._watches == 0:
                self._no_watches.set()

    async def _closed_and_told(self, sent: _StatusSent) -> None:
        await self._closing.wait()
        await sent.not_serving.wait()

    async def close(self, timeout: float) -> bool:
        """End every Watch (after enter_graceful_shutdown); False if some were still open after timeout."""
        self._closing.set()
        try:
            await asyncio.wait_for(self._no_watches.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
