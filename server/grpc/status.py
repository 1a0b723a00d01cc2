"""The gRPC door's one error mapping: attnserve/errors.py's Reason -> a gRPC status with its google.rpc details.

The errors carry what any door needs (a Reason, and for invalid input the `field` and `description`); only this
module speaks gRPC: the code, the human message, and the details client/status.py reads back (ErrorInfo,
BadRequest for INVALID_ARGUMENT, RetryInfo for a full queue). The HTTP door maps the same reasons in
server/http/errors.py.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from attnserve.errors import (
    DOMAIN,
    GraphBuildingError,
    InputTooLongError,
    QueueFullError,
    Reason,
    reason_and_message,
    truncation_fix,
)

# The most UTF-8 bytes of a status's message, and of its BadRequest description. Both travel in the trailers
# (grpc-message percent-encoded, the details base64-encoded in grpc-status-details-bin), and a client drops trailers
# over its metadata limit (grpc core's: 8 KiB soft, 16 KiB hard) and reports RESOURCE_EXHAUSTED "Stream removed"
# instead of the status: an error that quotes what a client sent (a 20 KiB model name) must still arrive. 1 KiB of
# each, percent-encoded at worst 3 KiB, keeps the whole status under the soft limit.
MAX_TEXT_BYTES = 1024
CLIPPED = " …(cut)"

# The status code each reason comes with.
CODES = {
    Reason.INVALID_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.MALFORMED_MESSAGE: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.MESSAGE_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,  # retrying cannot help (no RetryInfo)
    Reason.MODEL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.NOT_FOUND: grpc.StatusCode.UNIMPLEMENTED,
    Reason.METHOD_NOT_ALLOWED: grpc.StatusCode.UNIMPLEMENTED,
    Reason.QUEUE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,  # retry later (RetryInfo says when)
    Reason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    Reason.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,  # HTTP's alone: grpc bounds a call by its deadline
    Reason.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,  # retry on another replica
    Reason.NOT_SERVING: grpc.StatusCode.UNAVAILABLE,
    Reason.BATCH_FAILED: grpc.StatusCode.INTERNAL,  # retry
    Reason.GRAPH_BUILDING: grpc.StatusCode.UNAVAILABLE,  # retry later (RetryInfo says when)
    Reason.GRAPH_UNAVAILABLE: grpc.StatusCode.FAILED_PRECONDITION,  # the operator builds it (export --all)
    Reason.INTERNAL: grpc.StatusCode.INTERNAL,
}


def status_for(error: BaseException, request_index: int | None = None, request_type: str = "EmbedRequest",
               truncate_how: str | None = None) -> grpc.Status:
    """The status a client sees for error; request_index: which request of a stream it answers; request_type:
    the method's request message, which an over-long input's fix names; truncate_how: that fix in the method's own
    words, when truncation is no field of its message.

    Errors we did not expect are logged whole and told apart by name only. BadRequest's description stays the
    problem alone; the message adds the fix.
    """
    reason, message = reason_and_message(error)
    if isinstance(error, InputTooLongError):
        message += truncation_fix(error, truncate_how or f"set truncate: true (field `truncate` of {request_type})")
    if request_index is not None:
        message = f"request {request_index}: {message}"
    bad_request = CODES[reason] == grpc.StatusCode.INVALID_ARGUMENT
    return detailed_status(
        CODES[reason], message, reason, request_index,
        field=(getattr(error, "field", None) or "") if bad_request else None,
        description=getattr(error, "description", message) if bad_request else None,
        retry_delay=error.retry_after if isinstance(error, QueueFullError | GraphBuildingError) else None)


def detailed_status(code: grpc.StatusCode, message: str, reason: Reason | str, request_index: int | None = None,
                    field: str | None = None, description: str | None = None,
                    retry_delay: float | None = None) -> grpc.Status:
    """A status with the google.rpc details of client/status.py's contract: ErrorInfo always, BadRequest when a
    field is given, RetryInfo when a retry delay is."""
    message = clip(message)
    info = error_details_pb2.ErrorInfo(reason=str(reason), domain=DOMAIN)
    if request_index is not None:
        info.metadata["request_index"] = str(request_index)
    details: list = [info]
    if field is not None:
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=clip(field), description=clip(description or ""))]))
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


def clip(text: str) -> str:
    """text, cut to MAX_TEXT_BYTES of UTF-8 (at a character's boundary) and marked so when it was longer."""
    data = text.encode()
    if len(data) <= MAX_TEXT_BYTES:
        return text
    return data[:MAX_TEXT_BYTES - len(CLIPPED.encode())].decode(errors="ignore") + CLIPPED


async def abort(context: grpc.aio.ServicerContext, status: grpc.Status) -> NoReturn:
    """End the call with status, details included (raises grpc's AbortError, as context.abort does)."""
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("context.abort returned")  # for type checkers: it always raises
