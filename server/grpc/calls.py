"""What every call of attnserve's gRPC services goes through, whichever service (attnserve.v1's, KServe's): counted
in flight for the drain, its error mapped to a status (status.py), recorded in the metrics under its protocol."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ..core import Core
from ..metrics import Metrics
from ..requests import Deadline
from .status import abort, status_for

log = logging.getLogger("attnserve.server")


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
        start, code, tokens, recorded = time.perf_counter(), grpc.StatusCode.OK, 0, False
        with self._core.in_flight():
            try:
                reply, tokens = await answer()
                return reply
            except asyncio.CancelledError:
                code = cancel_code(context)
                raise
            except Exception as error:
                status = self.status(error, method)
                code = status.code
                # Recorded before the status goes out: a client that saw the error then sees it counted.
                self.record(method, code, start, inputs, tokens, context)
                recorded = True
                await abort(context, status)
            finally:
                if not recorded:
                    self.record(method, code, start, inputs, tokens, context)

    async def quick(self, method: str, context: grpc.aio.ServicerContext, answer: Callable[[], Any]) -> Any:
        """A call answered at once from what the server knows (metadata, readiness): its error mapped, counted
        untimed."""
        try:
            reply = answer()
        except Exception as error:
            status = self.status(error, method)
            self._metrics.observe_request(self.protocol, method, status.code.name)
            await abort(context, status)
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


def deadline(context: grpc.aio.ServicerContext) -> Deadline | None:
    """The call's deadline, or None."""
    remaining = context.time_remaining()
    return Deadline(time.monotonic() + remaining) if remaining is not None else None


def cancel_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    remaining = context.time_remaining()
    return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else grpc.StatusCode.CANCELLED
