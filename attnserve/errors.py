"""The one error vocabulary of attnserve: errors a user can cause and fix, each with a one-line message for them,
and the protocol-neutral Reason every front door and the client map from.

Anything else that escapes is a bug. The CLI prints these as one line and exits non-zero. Each front door maps
an error's `reason` to its protocol once: server/grpc/status.py to a gRPC status with google.rpc details,
server/http/errors.py to an HTTP status and the route family's envelope, as TEI's ErrorType has its two
conversions. client/status.py reads the reason back from a gRPC status.
"""

from __future__ import annotations

import logging
from enum import Enum

log = logging.getLogger("attnserve.server")

# google.rpc.ErrorInfo.domain of every error status an attnserve server sends.
DOMAIN = "attnserve.v1"


class Reason(str, Enum):
    """Why a request failed, named the same on every door: gRPC's ErrorInfo.reason, the code in OpenAI's
    envelope (lower case), the metrics' labels. A str, so the names compare equal to the wire's strings."""

    INVALID_INPUT = "INVALID_INPUT"  # an input or option of the request
    MALFORMED_MESSAGE = "MALFORMED_MESSAGE"  # bytes that do not parse as the request message or body
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"  # over max_request_bytes: retrying cannot help
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"  # a model name the server does not serve
    NOT_FOUND = "NOT_FOUND"  # no such route or method
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"  # a route that exists, asked with another method
    QUEUE_FULL = "QUEUE_FULL"  # retry later (after retry_after)
    UNAUTHENTICATED = "UNAUTHENTICATED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"  # the client took too long to send its request (HTTP's head or body)
    SHUTTING_DOWN = "SHUTTING_DOWN"  # retry on another replica
    NOT_SERVING = "NOT_SERVING"  # before warm-up and while draining (health and readiness)
    BATCH_FAILED = "BATCH_FAILED"  # retry
    GRAPH_BUILDING = "GRAPH_BUILDING"  # a graph the request needs is being built: retry after retry_after
    GRAPH_UNAVAILABLE = "GRAPH_UNAVAILABLE"  # a graph the request needs is not built, and cannot be here
    INTERNAL = "INTERNAL"

    def __str__(self) -> str:  # "QUEUE_FULL", not "Reason.QUEUE_FULL", in messages and on the wire
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def retryable(self) -> bool:
        """Whether the same request, sent again later, can succeed (DEADLINE_EXCEEDED is not: the deadline was
        the caller's to spend)."""
        return self in RETRYABLE


RETRYABLE = frozenset({Reason.QUEUE_FULL, Reason.SHUTTING_DOWN, Reason.BATCH_FAILED, Reason.GRAPH_BUILDING})


class AttnserveError(Exception):
    """Base: the message is shown to the user as it is."""

    # Why a request failed: set on the errors a request can meet, None on the rest.
    reason: Reason | None = None


class CheckpointError(AttnserveError):
    """A model checkpoint is missing, corrupt or not of a supported layout."""


class ArtifactError(AttnserveError):
    """An exported artifact directory is missing a file, tampered with, or inconsistent."""


class InvalidInputError(AttnserveError):
    """An input text, token sequence or input file cannot be encoded as given.

    In a request, `field` is where the problem is, as a path in the request message ("inputs[3].text",
    "attention.layers[1]", "inputs" for their number, "" for the whole message), and `description` the problem
    alone ("empty text"), while the message names both ("input 3: empty text"). field is None where the input
    is not a request (a line of a file).
    """

    reason = Reason.INVALID_INPUT

    def __init__(self, message: str, *, field: str | None = None, description: str | None = None):
        super().__init__(message)
        self.field = field
        self.description = message if description is None else description


class InputTooLongError(InvalidInputError):
    """An input (or pair) is longer than max_seq_length and truncation is off for its request.

    The message names the input and the problem alone, in no protocol's words. The fix depends on the door
    (the request field that allows truncation, as that door spells it) and on who turned truncation off, so each
    door's error mapping adds it: `server_default` is True when the request left `truncate` unset and the
    server's --long-inputs refuse refused the input, False when the request itself asked for `truncate: false`.
    """

    def __init__(self, message: str, *, field: str | None = None, description: str | None = None,
                 server_default: bool = False):
        super().__init__(message, field=field, description=description)
        self.server_default = server_default


class AttentionTooLongError(InputTooLongError):
    """An attention request's input is longer than the model's attention_max_length: its attention maps (layers x
    heads x tokens^2 floats) would not fit in memory. Truncation does not help (it cuts at max_seq_length): the
    message names the cap, and the doors add no truncation fix."""


# The server setting that takes over-long inputs rather than refusing them (ServerConfig.long_inputs), as every door
# names it.
LONG_INPUTS_FIX = "--long-inputs truncate (the default) or chunk"


def truncation_fix(error: InputTooLongError, how: str) -> str:
    """The fix of an over-long input, for a door's error mapping to append to the message; `how` says how that
    door's requests allow truncation, in its own words ('set "truncate": true in the body')."""
    if isinstance(error, AttentionTooLongError):
        return ""
    if error.server_default:
        return f"; to cut it to max_seq_length instead, {how}, or start the server with {LONG_INPUTS_FIX}"
    return f", and the request asked not to truncate; to cut it to max_seq_length instead, {how}"


class ExportVerificationError(AttnserveError):
    """An exported graph does not match PyTorch within its tolerance."""


class ConfigError(AttnserveError):
    """A flag, environment variable or option has a value that cannot work."""


# Errors a request can meet in the server, whatever door it came through.

class QueueFullError(AttnserveError):
    """The queue cannot take this request's tokens now; the client may retry after `retry_after` seconds."""

    reason = Reason.QUEUE_FULL

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class GraphBuildingError(AttnserveError):
    """A graph the request needs (the attention graph, say) is not built yet and is being built now
    (engine/builds.py): the same request succeeds once it is, after about `retry_after` seconds. The server's core
    holds the request until then (server/build_wait.py); a client sees this only past the server's --max-build-wait.

    needs and what: what was required (Engine.require's arguments), so that a waiting request asks again for them
    alone, without preparing itself again."""

    reason = Reason.GRAPH_BUILDING

    def __init__(self, message: str, retry_after: float, needs: tuple[str, ...] = (), what: str = ""):
        super().__init__(message)
        self.retry_after, self.needs, self.what = retry_after, needs, what


class GraphUnavailableError(AttnserveError):
    """A graph the request needs is not built, and this server cannot build it (no torch, a read-only directory,
    the checkpoint gone, or its build failed): retrying cannot help; the message says what would."""

    reason = Reason.GRAPH_UNAVAILABLE


class ShuttingDownError(AttnserveError):
    """The server is draining and takes no new work."""

    reason = Reason.SHUTTING_DOWN


class EngineStoppedError(ShuttingDownError):
    """`serve --workers N`: the engine process this front-door worker sends its requests to is gone; the request
    was not answered (retryable: UNAVAILABLE, 503), and the server exits."""


class DeadlineExpiredError(AttnserveError):
    """The request's deadline passed before its inputs could run."""

    reason = Reason.DEADLINE_EXCEEDED


class RequestTimeoutError(AttnserveError):
    """The client did not send its whole request (an HTTP head or body) within the server's timeout."""

    reason = Reason.REQUEST_TIMEOUT


class BatchFailedError(AttnserveError):
    """The batch this request's inputs ran in failed; other batches are unaffected."""

    reason = Reason.BATCH_FAILED


class MalformedMessageError(InvalidInputError):
    """The bytes of a request message do not parse as the method's request type."""

    reason = Reason.MALFORMED_MESSAGE

    def __init__(self, message: str):
        super().__init__(message, field="")


class MessageTooLargeError(AttnserveError):
    """A request message is over max_request_bytes: the same request can never succeed."""

    reason = Reason.MESSAGE_TOO_LARGE


class UnauthenticatedError(AttnserveError):
    """No API key, or not one of the server's."""

    reason = Reason.UNAUTHENTICATED


class ModelNotFoundError(AttnserveError):
    """A request names a model this server does not serve (the HTTP routes that take a model name)."""

    reason = Reason.MODEL_NOT_FOUND
    field = "model"


class RouteNotFoundError(AttnserveError):
    """No route or method of that name."""

    reason = Reason.NOT_FOUND


class MethodNotAllowedError(AttnserveError):
    """The route exists, but not for this method; `allowed` lists the methods it takes."""

    reason = Reason.METHOD_NOT_ALLOWED

    def __init__(self, message: str, allowed: tuple[str, ...] = ()):
        super().__init__(message)
        self.allowed = allowed


class NotServingError(AttnserveError):
    """The server is not ready (warming up) or is draining: health and readiness answer so."""

    reason = Reason.NOT_SERVING


def reason_and_message(error: BaseException) -> tuple[Reason, str]:
    """The reason and the human message a client of any door sees. Errors we did not expect (no AttnserveError,
    or one without a reason) are logged whole and told apart by name only."""
    reason = error.reason if isinstance(error, AttnserveError) else None
    if reason is not None:
        return reason, str(error)
    log.error("unexpected error while serving a request", exc_info=error)
    return Reason.INTERNAL, f"internal error ({type(error).__name__}); the server log has the details"
