"""HTTP bytes in and out: the body read under max_request_bytes and parsed, off the event loop when large; JSON
written with orjson straight from numpy; floats as base64 straight from their float32 bytes; the deadline a
request may carry, which the core runs the request under.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

import numpy as np
import orjson
from aiohttp import web

from attnserve.engine.outputs import EncodeReply
from attnserve.errors import (
    InvalidInputError,
    MalformedMessageError,
    MessageTooLargeError,
    RequestTimeoutError,
)

from ..requests import Deadline
from ..sizes import human_size
from .bodies import Body
from .parsing import parse

T = TypeVar("T")

# Bodies larger than this are parsed in the thread pool: 1,000 texts take about 1 ms to parse, 1 MB of token
# ids 40 ms; a short request parses in microseconds, less than the hop to a thread would cost.
PARSE_OFF_LOOP_BYTES = 64 * 1024
# What one float of a reply costs on the wire, for the reply size limit: orjson writes a float32 in 11 to 14
# characters with its comma on average (measured: 12.2 for unit vectors, 13.7 for attention probabilities such
# as 1.2345678e-05), base64 takes 4/3 of its 4 bytes.
JSON_FLOAT_BYTES = 14.0
BASE64_FLOAT_BYTES = 16 / 3
# Seconds the client gives the request, as gRPC's deadline does; past it the answer is 504.
TIMEOUT_HEADER = "X-Request-Timeout"
JSON = "application/json"
# Set on a request whose `Expect: 100-continue` was answered 100 (HttpDoor._expect): its body is on its way.
BODY_INVITED = "attnserve.body_invited"
NUMPY = orjson.OPT_SERIALIZE_NUMPY


class ClientGoneError(Exception):
    """The client closed its connection before its request was read: nothing to answer, and not the server's
    failure (the door logs it at INFO, without a traceback, and counts it as 499)."""


class BodyReader:
    """Reads request bodies: at most max_bytes (the Application's client_max_size) within timeout seconds, parsed
    off the loop when large."""

    def __init__(self, executor: Executor, max_bytes: int, timeout: float):
        self._executor, self.max_bytes, self.timeout = executor, max_bytes, timeout

    async def read(self, request: web.Request, model: type[Body], translate: Callable[[Body], T]) -> T:
        """The body parsed as `model` and translated by `translate` (the route's JSON -> the core's request); its
        errors name the path it was sent to."""
        return await self.read_bytes(request, lambda body: translate(parse(model, body, request.path)))

    async def read_bytes(self, request: web.Request, translate: Callable[[bytes], T]) -> T:
        """The body's bytes translated by `translate`, for a wire that is not only JSON (KServe's binary tensors)."""
        if (request.content_length or 0) > self.max_bytes:  # said up front: refused before a byte is read
            raise self._too_large()
        try:
            # A body that arrived with its head (most) is read without a timer: wait_for costs a task a request.
            body = await (request.read() if request.content.is_eof() else
                          asyncio.wait_for(request.read(), self.timeout))
        except web.HTTPRequestEntityTooLarge:  # aiohttp stops reading at client_max_size
            raise self._too_large() from None
        except asyncio.TimeoutError:
            raise RequestTimeoutError(f"the request body did not arrive within {self.timeout:g} s "
                                      "(the server's http_body_timeout)") from None
        except web.RequestPayloadError:  # its framing or its Content-Encoding does not hold
            raise MalformedMessageError(_payload_problem(request)) from None
        except ConnectionError:  # aiohttp's "Connection lost": the client went away while it sent the body
            raise ClientGoneError("the client disconnected while it sent the request body") from None

        def parse_and_translate() -> T:
            return translate(body)

        if len(body) > PARSE_OFF_LOOP_BYTES:
            return await asyncio.get_running_loop().run_in_executor(self._executor, parse_and_translate)
        return parse_and_translate()

    def _too_large(self) -> MessageTooLargeError:
        return MessageTooLargeError(f"the request body is over this server's max_request_bytes "
                                    f"({human_size(self.max_bytes)}); send fewer or shorter inputs per request")

    async def discard(self, request: web.Request) -> bool:
        """Read what is left of a body the route did not read (an error answered first), so that the connection
        can take its next request. False where it cannot: the body is broken, too large or too slow, and the
        connection must close."""
        content = request.content
        if content.exception() is not None or (request.content_length or 0) > self.max_bytes:
            return False
        if request.headers.get("Expect", "").lower() == "100-continue" and not request.get(BODY_INVITED):
            return False  # the client holds its body back until a 100 that never came: it would only time out
        if content.is_eof():  # read whole, or none sent: every request a route answered from its body
            return True

        async def drain() -> bool:
            left = self.max_bytes
            while not content.is_eof():
                left -= len(await content.readany())
                if left < 0:
                    return False
            return True

        try:
            return await asyncio.wait_for(drain(), self.timeout)
        except (asyncio.TimeoutError, web.RequestPayloadError, ConnectionError):
            return False


def _payload_problem(request: web.Request) -> str:
    """What is wrong with a body aiohttp could not read, naming the encoding it claims, never its bytes."""
    encoding = request.headers.get("Content-Encoding", "identity")
    framing = "its chunked framing" if request.headers.get("Transfer-Encoding") else "its length"
    if encoding.lower() != "identity":
        return f"the body does not decode as its Content-Encoding ({encoding}) says, or {framing} is broken"
    return f"the body cannot be read: {framing} is broken"


def deadline(request: web.Request) -> Deadline | None:
    """The request's deadline from X-Request-Timeout, in seconds; None: none."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:  # also NaN
        raise InvalidInputError(f"{TIMEOUT_HEADER}: {raw!r} is not a positive number of seconds",
                                field=TIMEOUT_HEADER, description="not a positive number of seconds")
    return Deadline(time.monotonic() + seconds, TIMEOUT_HEADER)


def json_response(body: bytes, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)


def dumps(value) -> bytes:
    return orjson.dumps(value, option=NUMPY)


def floats(array: np.ndarray, base64_format: bool):
    """An array for a JSON reply: itself (orjson writes it as nested lists), or base64 of its row-major
    little-endian float32 bytes."""
    if base64_format:
        return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").data).decode("ascii")
    return np.ascontiguousarray(array, dtype=np.float32)


class InputMarks:
    """A render that also notes which inputs the reply did not take whole, for the routes whose body has no place
    to say it (TEI's /embed, OpenAI's and Cohere's embeddings, KServe's infer): headers() then gives
    X-Truncated-Inputs (cut at max_seq_length) and X-Chunked-Inputs (embedded in windows: --long-inputs chunk),
    each the inputs' indices, comma-separated, where there are any."""

    def __init__(self, render: Callable[[EncodeReply], bytes]):
        self._render = render
        self._headers: dict[str, str] = {}

    def __call__(self, reply: EncodeReply) -> bytes:
        for name, marked in (("X-Truncated-Inputs", [i for i, x in enumerate(reply.inputs) if x.truncated]),
                             ("X-Chunked-Inputs", [i for i, x in enumerate(reply.inputs) if x.windows > 1])):
            if marked:
                self._headers[name] = ",".join(map(str, marked))
        return self._render(reply)

    def headers(self) -> dict[str, str] | None:
        return self._headers or None
