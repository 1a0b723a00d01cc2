"""The reply to a request aiohttp cannot parse: a control byte in a header, two Content-Lengths, a bad chunk size,
a line or a head over its limits, a request line that is not HTTP.

aiohttp answers those itself, before any route or middleware runs, in text/plain that quotes the offending bytes,
an Authorization header with its key included, so no client of ours can read it as an error and a key can come
back in a reply that proxies and clients log. Here it is the door's own envelope instead: TEI's, the family of
`/`, since the path of a request that does not parse is not known (the header timeout's 408 answers the same way).
The message names the kind of problem in words and quotes none of the request's bytes. The status and the closing
of the connection stay aiohttp's; so does the log line (protocol_log.py).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadStatusLine,
    ContentEncodingError,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.web_protocol import RequestHandler

from attnserve.errors import MalformedMessageError

from .errors import TEI, http_error

# Each kind of parse error in words, most specific first; never str(error), which quotes the request's bytes.
PROBLEMS: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (LineTooLong, "a line of its head is over the server's limit (8190 bytes)"),
    (InvalidHeader, "a header is malformed"),
    (InvalidURLError, "its URL is malformed"),
    (BadStatusLine, "its request line is not HTTP/1.1 (a bad method, path or version)"),
    (TransferEncodingError, "its chunked body is malformed"),
    (ContentLengthError, "its body is not as long as its Content-Length says"),
    (ContentEncodingError, "its body does not decode as its Content-Encoding says"),
    (BadHttpMessage, "its head is malformed (a control byte in a header, a bad or repeated Content-Length, "
                     "too many headers, a missing Host)"),
)


def problem(error: HttpProcessingError) -> str:
    return next((words for kind, words in PROBLEMS if isinstance(error, kind)), "it does not parse")


class _AnswersInJson(RequestHandler):
    """aiohttp's protocol for one connection, its replies to requests that do not parse made JSON."""

    __slots__ = ()  # RequestHandler has slots: no attribute of its own can be set, a method can be overridden

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        reply = super().handle_error(request, status, exc, message)  # logs (through ProtocolLog), says the status
        if not isinstance(exc, HttpProcessingError) or not 400 <= reply.status < 500:
            return reply
        error = http_error(MalformedMessageError(f"the request is not valid HTTP/1.1: {problem(exc)}"), TEI)
        # Closed, as aiohttp's own is: the connection's framing cannot be trusted past this request. Said in a header
        # too, since the reply's version may be HTTP/1.1 where the request line was.
        answer = web.Response(status=reply.status, body=error.body, content_type="application/json",
                              headers={"Connection": "close"})
        answer.force_close()
        return answer


def answer_in_envelope(handler: RequestHandler) -> RequestHandler:
    """handler (one connection's aiohttp protocol, as aiohttp's Server made it), answering unparsed requests in
    JSON. aiohttp has no hook for this reply and builds the handler itself: the same object, of the subclass (which
    adds no state, so the layout is the same)."""
    handler.__class__ = _AnswersInJson
    return handler
