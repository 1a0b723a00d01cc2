"""Asking a server's standard gRPC health service (grpc.health.v1) whether it serves, and waiting until it does.

The one place that reads the health protocol on the client side: `attnserve health` asks once,
`attnserve loadtest --wait-ready` waits, and so do the tests and benchmarks for the servers they start
(attnserve.server_process). The server says SERVING only after its graphs are warmed up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.errors import AttnserveError

from .reach import why_no_grpc

# Seconds between two questions, and the longest one question may take: a health check is answered at
# once, even by a busy server, so a longer wait means the channel is still connecting, and the caller may
# want to look at something else (did the server process exit?) before asking again.
POLL_SECONDS, PROBE_SECONDS = 0.1, 2.0


class NotServing(AttnserveError):
    """The target did not say SERVING in time. status: the last status it gave (e.g. NOT_SERVING), None when
    it gave none (the call failed); the message says why. explained: the message says what is at the target
    instead (nothing, or a server of another protocol: client/reach.py), so waiting longer would not help."""

    def __init__(self, message: str, status: str | None, explained: bool = False):
        super().__init__(message)
        self.status, self.explained = status, explained


def wait_until_serving(channel: grpc.Channel, target: str, seconds: float, *, service: str = "",
                       probe_seconds: float = PROBE_SECONDS, gave_up: Callable[[], str | None] | None = None
                       ) -> None:
    """Return once the health service behind channel says SERVING for service ("" : the whole server).

    seconds 0 asks once. Otherwise the questions wait for the channel to connect (wait_for_ready), so a
    server that comes up is seen as soon as it listens. gave_up() may return why waiting is pointless
    (say, the server process exited); it is asked after every failed question. Raises NotServing.
    """
    health = health_pb2_grpc.HealthStub(channel)
    end = time.monotonic() + seconds
    while True:
        probe = min(probe_seconds, end - time.monotonic()) if seconds else probe_seconds
        status, failed = None, None
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=max(probe, 0.01),
                                 wait_for_ready=seconds > 0)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            last = status
        except grpc.RpcError as error:
            last, failed = f"{error.code().name}: {error.details()}", error.code()
        reason = gave_up() if gave_up else None
        if reason:
            raise NotServing(f"{target} is not serving: {reason} ({last})", status)
        if time.monotonic() + POLL_SECONDS >= end:
            waited = f" after waiting {seconds:g} s" if seconds else ""
            # No answer at all: say what is (not) there, once, rather than the transport's words.
            explained = why_no_grpc(target) if failed == grpc.StatusCode.UNAVAILABLE else None
            if explained:
                raise NotServing(f"{explained}{waited}", status, explained=True)
            raise NotServing(f"{target} is not serving{waited}: {last}", status)
        time.sleep(POLL_SECONDS)
