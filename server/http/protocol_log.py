"""What aiohttp's HTTP protocol logs, made safe: the `logger` it is given (RequestHandler's own hook).

aiohttp logs every request it cannot parse (a bad chunk size, a long URL, too many or too large headers, a
missing Host, a bad method, a body whose Content-Encoding lies) with logger.exception: an ERROR with a traceback
whose message quotes the raw bytes of the offending line, an Authorization header with its key included. Those are
the client's mistakes, answered with a 4xx: here each is one WARNING line naming the error's kind, never its text,
and at most Throttle's limit of them a minute. Anything else aiohttp reports is a fault of ours and stays an ERROR
with its traceback.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..logs import Throttle

# Errors a client causes: its bytes do not parse, its body does not decode, or it went away.
CLIENT_ERRORS = (HttpProcessingError, web.RequestPayloadError, ConnectionError)


class ProtocolLog:
    """Takes the calls aiohttp's RequestHandler makes on its logger (debug, warning, exception)."""

    def __init__(self, log: logging.Logger, throttle: Throttle | None = None):
        self._log, self._throttle = log, throttle or Throttle()

    def exception(self, msg: str, *args, exc_info: BaseException | None = None, **kwargs) -> None:
        if isinstance(exc_info, CLIENT_ERRORS):
            self._client_error(exc_info, args)
        else:
            self._log.error(msg, *args, exc_info=exc_info or True, **kwargs)

    error = exception

    def debug(self, msg: str, *args, exc_info: BaseException | None = None, **kwargs) -> None:
        # aiohttp logs a bad method on a connection's first request at debug (TLS sent to the HTTP port): the same
        # client mistake as the others, so the same line; its other debug lines (disconnections) stay debug.
        if isinstance(exc_info, CLIENT_ERRORS):
            self._client_error(exc_info, args)
        elif self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(msg, *args, **kwargs)

    def warning(self, msg: str, *args, **kwargs) -> None:
        self._log.warning(msg, *args, **kwargs)

    def _client_error(self, error: BaseException, args: tuple) -> None:
        held_back = self._throttle.allow()
        if held_back is None:
            return
        # The error's class, its status and the peer; never str(error), which quotes the request's bytes.
        fields: dict[str, object] = {"event": "bad_http_request", "error": type(error).__name__}
        if isinstance(error, HttpProcessingError):
            fields["code"] = error.code  # the status aiohttp answered
        if args and isinstance(args[0], str):  # "Error handling request from %s", the peer's address
            fields["peer"] = args[0]
        if held_back:
            fields["held_back"] = held_back
        self._log.warning("bad HTTP request from a client",
                          extra={"fields": fields})
