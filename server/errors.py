"""Every error a request can meet, and the one function that maps it to a gRPC status with its details.

The errors carry what any front door needs (a `reason` of client/status.py REASONS, and for invalid input the
`field` and `description`); only status_for speaks gRPC: the code, the human message, and the google.rpc
details that client/status.py reads back (ErrorInfo, BadRequest for INVALID_ARGUMENT, RetryInfo for a full queue).
The HTTP door maps the same errors to its statuses in server/http/errors.py.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from attnserve.client.status import DOMAIN, REASONS
from attnserve.errors import AttnserveError, InvalidInputError

log = logging.getLogger("attnserve.server")


class QueueFullError(AttnserveError):
    """The queue cannot take this request's tokens now; the client may retry after `retry_after` seconds."""

    reason = "QUEUE_FULL"

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDownError(AttnserveError):
    """The server is draining and takes no new work."""

    reason = "SHUTTING_DOWN"


class DeadlineExpiredError(AttnserveError):
    """The request's deadline passed before its inputs could run."""

    reason = "DEADLINE_EXCEEDED"


class BatchFailedError(AttnserveError):
    """The batch this request's inputs ran in failed; other batches are unaffected."""

    reason = "BATCH_FAILED"


class MalformedMessageError(InvalidInputError):
    """The bytes of a request message do not parse as the method's request type."""

    reason = "MALFORMED_MESSAGE"

    def __init__(self, message: str):
        super().__init__(message, field="")


class MessageTooLargeError(AttnserveError):
    """A request message is over max_request_bytes: the same request can never succeed."""

    reason = "MESSAGE_TOO_LARGE"


class RequestTooLargeError(InvalidInputError):
    """A request holds more tokens than the whole queue can: the same request can never succeed, unlike a
    request refused because the queue is full now."""

    reason = "REQUEST_TOO_LARGE"


class UnauthenticatedError(AttnserveError):
    """No API key, or not one of the server's."""

    reason = "UNAUTHENTICATED"


class ModelNotFoundError(AttnserveError):
    """A request names a model this server does not serve (the HTTP routes that take a model name)."""

    reason = "MODEL_NOT_FOUND"
    field = "model"


def reason_and_message(error: BaseException, known: Container[str]) -> tuple[str, str]:
    """The reason and the human message a client of either door sees. Errors we did not expect (a reason the
    door does not know, or no AttnserveError at all) are logged whole and told apart by name only."""
    reason = error.reason if isinstance(error, AttnserveError) else None
    if reason is not None and reason in known:
        return reason, str(error)
    log.error("unexpected error while serving a request", exc_info=error)
    return "INTERNAL", f"internal error ({type(error).__name__}); the server log has the details"


def status_for(error: BaseException, request_index: int | None = None) -> grpc.Status:
    """The status a client sees for error; request_index: which request of a stream it answers.

    Errors we did not expect are logged whole and told apart by name only.
    """
    reason, message = reason_and_message(error, REASONS)
    if request_index is not None:
        message = f"request {request_index}: {message}"
    bad_request = REASONS[reason] == grpc.StatusCode.INVALID_ARGUMENT
    return detailed_status(
        REASONS[reason], message, reason, request_index,
        field=(getattr(error, "field", None) or "") if bad_request else None,
        description=getattr(error, "description", message) if bad_request else None,
        retry_delay=error.retry_after if isinstance(error, QueueFullError) else None)


def detailed_status(code: grpc.StatusCode, message: str, reason: str, request_index: int | None = None,
                    field: str | None = None, description: str | None = None,
                    retry_delay: float | None = None) -> grpc.Status:
    """A status with the google.rpc details of client/status.py's contract: ErrorInfo always, BadRequest when a
    field is given, RetryInfo when a retry delay is."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN)
    if request_index is not None:
        info.metadata["request_index"] = str(request_index)
    details: list = [info]
    if field is not None:
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=description)]))
    if retry_delay is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(round(retry_delay * 1e9))
        details.append(retry)
    packed = []
    for detail in details:
        any_detail = any_pb2.Any()
        any_detail.Pack(detail)
        packed.append(any_detail)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=packed))


async def abort(context: grpc.aio.ServicerContext, status: grpc.Status) -> NoReturn:
    """End the call with status, details included (raises grpc's AbortError, as context.abort does)."""
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("context.abort returned")  # for type checkers: it always raises
