"""Every error a request can meet, and the one function that maps it to a gRPC status."""

from __future__ import annotations

import logging

import grpc

from attnserve.errors import AttnserveError, InvalidInputError

log = logging.getLogger("attnserve.server")


class QueueFullError(AttnserveError):
    """The queue cannot take this request's tokens now; the client may retry later."""


class ShuttingDownError(AttnserveError):
    """The server is draining and takes no new work."""


class DeadlineExpiredError(AttnserveError):
    """The request's deadline passed before its inputs could run."""


class BatchFailedError(AttnserveError):
    """The batch this request's inputs ran in failed; other batches are unaffected."""


_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExpiredError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ShuttingDownError, grpc.StatusCode.UNAVAILABLE),
    (BatchFailedError, grpc.StatusCode.INTERNAL),
)


def status_for(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message a client sees. Errors we did not expect are logged whole and told apart by name."""
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code, str(error)
    log.error("unexpected error while serving a request", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}); the server log has the details"
