"""The structured part of an error status from an attnserve server, read back from a grpc.RpcError.

The server attaches a google.rpc.Status (trailer `grpc-status-details-bin`, through grpcio-status)
to every error it answers with, beside the human message:

    google.rpc.ErrorInfo   reason (attnserve/errors.py Reason), domain "attnserve.v1",
                           metadata {"request_index": "k"} on EmbedStream: the k-th request of the stream (from 0)
    google.rpc.BadRequest  INVALID_ARGUMENT only: one field violation, field = the path in the request
                           ("inputs[3]", "inputs[3].token_ids", "attention.layers[1]"; "" for the whole message)
                           and description = the problem alone ("empty text")
    google.rpc.RetryInfo   only where retrying the same request later can succeed (queue full): retry_delay

So a client never parses the message text: `error_details(e).input_index` is the input a server refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from attnserve.errors import RETRYABLE

# Where the same request, sent again later, can succeed: by the server's reason when it gave one (attnserve/errors.py
# Reason.retryable), else by the code alone (the transport, a proxy, another server): codes that say "not now",
# not "not this".
RETRYABLE_REASONS = RETRYABLE
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})
_INPUT_FIELD = re.compile(r"inputs\[(\d+)\]")


@dataclass(frozen=True)
class ErrorDetails:
    code: grpc.StatusCode
    message: str  # the human message, as error.details() has it
    reason: str | None = None  # ErrorInfo.reason; None from a server (or proxy) that attached no details
    request_index: int | None = None  # which request of an EmbedStream the error answers
    field: str | None = None  # BadRequest: the path of the offending field in the request
    description: str | None = None  # BadRequest: the problem, without the path
    retry_delay: float | None = None  # RetryInfo: seconds to wait before retrying; None: do not retry as is

    @property
    def retryable(self) -> bool:
        """Whether the same request, sent again later, can succeed (DEADLINE_EXCEEDED is not: the deadline was
        the caller's to spend)."""
        return self.reason in RETRYABLE_REASONS if self.reason else self.code in RETRYABLE_CODES

    @property
    def input_index(self) -> int | None:
        """The index of the input the server refused, when the error names one."""
        match = _INPUT_FIELD.match(self.field or "")
        return int(match.group(1)) if match else None


def error_details(error: grpc.RpcError) -> ErrorDetails:
    """The code, message and attached details of a failed call (a sync or asyncio grpc error)."""
    code, message = error.code(), error.details() or ""
    try:
        status = _status(error)
    except ValueError:  # the trailer disagrees with the status: not ours to trust
        status = None
    if status is None:
        return ErrorDetails(code, message)
    fields: dict = {}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            fields["reason"] = info.reason
            if "request_index" in info.metadata:
                fields["request_index"] = int(info.metadata["request_index"])
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            if bad.field_violations:
                fields["field"] = bad.field_violations[0].field
                fields["description"] = bad.field_violations[0].description
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            fields["retry_delay"] = retry.retry_delay.ToTimedelta().total_seconds()
    return ErrorDetails(code, message, **fields)


def _status(error: grpc.RpcError):
    # grpc.aio errors carry their trailers as an aio.Metadata; the sync ones as tuples: rpc_status reads both
    # once they look like a grpc.Call.
    if isinstance(error, grpc.aio.AioRpcError):
        for key, value in error.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                from google.rpc import status_pb2

                status = status_pb2.Status.FromString(value)
                return status if status.code == error.code().value[0] else None
        return None
    if not hasattr(error, "trailing_metadata"):
        return None
    return rpc_status.from_call(error)
