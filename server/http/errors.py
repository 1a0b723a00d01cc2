"""Every error an HTTP request can meet -> its HTTP status, headers and body: the HTTP door's one mapping, as
server/grpc/status.py is the gRPC door's.

The status comes from the error's protocol-neutral `reason` alone (HTTP_STATUS). The body takes the envelope of
the route's family: OpenAI's `{"error": {"message", "type", "param", "code"}}` on /v1/*, TEI's
`{"error", "error_type"}` on TEI's routes, KServe v2's `{"error"}` on /v2/*. `param` is the field the error
names, in the route's own wire names. An input over max_seq_length that was refused gets the fix in the route's
words: the field that allows truncation, as its family (or the route, WireNames.truncate) spells it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import orjson

from attnserve.errors import (
    GraphBuildingError,
    InputTooLongError,
    InvalidInputError,
    MethodNotAllowedError,
    QueueFullError,
    Reason,
    reason_and_message,
    truncation_fix,
)

OPENAI, TEI, KSERVE = "openai", "tei", "kserve"

HTTP_STATUS = {
    Reason.INVALID_INPUT: 400,  # an input or option of the request
    Reason.MALFORMED_MESSAGE: 400,  # a body that is not JSON, or not of the route's shape
    Reason.UNAUTHENTICATED: 401,
    Reason.MODEL_NOT_FOUND: 404,
    Reason.NOT_FOUND: 404,  # no such route
    Reason.METHOD_NOT_ALLOWED: 405,
    Reason.MESSAGE_TOO_LARGE: 413,  # a body over max_request_bytes
    Reason.QUEUE_FULL: 429,  # retry after Retry-After
    Reason.BATCH_FAILED: 500,  # retry
    Reason.GRAPH_BUILDING: 503,  # retry after Retry-After: the graph the request needs is being built
    Reason.GRAPH_UNAVAILABLE: 501,  # not built, and not buildable here: the operator builds it (export --all)
    Reason.INTERNAL: 500,
    Reason.SHUTTING_DOWN: 503,  # retry on another replica
    Reason.NOT_SERVING: 503,  # /health before warm-up and while draining
    Reason.DEADLINE_EXCEEDED: 504,
    Reason.REQUEST_TIMEOUT: 408,  # the client's head or body came too slowly
}

# OpenAI's error types by status class, and TEI's error_type by reason.
_OPENAI_TYPE = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error"}
_OPENAI_CODE = {Reason.UNAUTHENTICATED: "invalid_api_key"}  # else the reason in lower case: "model_not_found"
_TEI_TYPE = {Reason.INVALID_INPUT: "Validation", Reason.MALFORMED_MESSAGE: "Validation",
             Reason.MESSAGE_TOO_LARGE: "Validation",
             Reason.UNAUTHENTICATED: "Unauthorized", Reason.MODEL_NOT_FOUND: "NotFound", Reason.NOT_FOUND: "NotFound",
             Reason.METHOD_NOT_ALLOWED: "MethodNotAllowed", Reason.QUEUE_FULL: "Overloaded",
             Reason.DEADLINE_EXCEEDED: "Overloaded", Reason.REQUEST_TIMEOUT: "Validation",
             Reason.SHUTTING_DOWN: "Unhealthy",
             Reason.NOT_SERVING: "Unhealthy", Reason.BATCH_FAILED: "Backend", Reason.INTERNAL: "Backend",
             Reason.GRAPH_BUILDING: "Overloaded", Reason.GRAPH_UNAVAILABLE: "Backend"}
# How a family's requests allow truncation, for the fix of an over-long input.
_TRUNCATE = {OPENAI: 'set "truncate": true in the body', TEI: 'set "truncate": true in the body',
             KSERVE: 'set "parameters": {"truncate": true} in the request (tritonclient: '
                     'infer(..., parameters={"truncate": True}))'}


@dataclass(frozen=True)
class WireNames:
    """How a route's family names the core's neutral fields: a prefix replaced ("inputs" -> "input",
    "attention." -> ""); and in JSON an input is its text or its ids, so ".text" and ".token_ids" go.
    truncate: how this route's requests allow truncation, where it says more than its family's way (_TRUNCATE)."""

    prefixes: dict[str, str] = field(default_factory=dict)
    truncate: str | None = None

    def __call__(self, neutral: str) -> str:
        for old, new in self.prefixes.items():
            if neutral.startswith(old):
                neutral = new + neutral[len(old):]
                break
        for kind in (".text", ".token_ids"):
            if neutral.endswith(kind):
                return neutral[: -len(kind)]
        return neutral


class WireFieldError(InvalidInputError):
    """A body's error as its parser found it (parsing.parse): its field is already the route's wire name, not the
    core's neutral one, so it is not renamed (an `inputs` sent to OpenAI's route is TEI's field, not the core's
    inputs, which that route calls `input`)."""


@dataclass(frozen=True)
class HttpError:
    status: int
    body: bytes
    headers: dict[str, str]


def http_error(error: BaseException, style: str, names: WireNames | None = None) -> HttpError:
    """The status, headers and body a client sees for error on a route of `style` (OPENAI, TEI or KSERVE).

    Errors we did not expect are logged whole and told apart by name only.
    """
    reason, message = reason_and_message(error)
    status = HTTP_STATUS[reason]
    headers = {}
    if isinstance(error, QueueFullError | GraphBuildingError):
        # Retry-After is whole seconds; the openai SDK reads retry-after-ms first, to the millisecond.
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
        headers["retry-after-ms"] = str(max(1, round(error.retry_after * 1e3)))
    if isinstance(error, MethodNotAllowedError) and error.allowed:
        headers["Allow"] = ", ".join(error.allowed)  # RFC 9110: a 405 lists the methods the route takes
    if reason == Reason.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = "Bearer"
    if reason == Reason.SHUTTING_DOWN:
        headers["Connection"] = "close"  # a kept-alive client reconnects, to another replica
    field = getattr(error, "field", None) or None
    wire_field = names(field) if names and field and not isinstance(error, WireFieldError) else field
    if field and message.startswith(f"{field}: "):  # a message that names the field names it as the route does
        message = f"{wire_field}{message[len(field):]}"
    if isinstance(error, InputTooLongError):
        message += truncation_fix(error, names.truncate if names and names.truncate else _TRUNCATE[style])
    body: dict[str, object]
    if style == OPENAI:
        body = {"error": {"message": message, "type": _OPENAI_TYPE.get(status, "server_error"), "param": wire_field,
                          "code": _OPENAI_CODE.get(reason, reason.value.lower())}}
    elif style == KSERVE:
        body = {"error": message}
    else:
        body = {"error": message, "error_type": _TEI_TYPE[reason]}
    return HttpError(status, orjson.dumps(body), headers)
