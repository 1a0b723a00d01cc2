"""attnserve's POST /embed_multi: a ColBERT model's vectors, one per kept token, per input (engine/multi_vector.py),
as TEI's routes shape a batch: a list with one entry per input, [tokens, dim] floats or their base64."""

from __future__ import annotations

from aiohttp import web

from attnserve.engine.outputs import EncodeReply

from ..core import Core
from ..requests import EncodeRequest
from .attnserve_bodies import MultiVectorBody
from .errors import TEI
from .route import Route
from .wire import BASE64_FLOAT_BYTES, JSON_FLOAT_BYTES, BodyReader, deadline, dumps, floats, json_response


def to_core(body: MultiVectorBody) -> EncodeRequest:
    return EncodeRequest(inputs=[body.inputs] if isinstance(body.inputs, str) else body.inputs,
                         truncate=body.truncate, model=body.model or None, multi_vector=body.input_type)


def render(reply: EncodeReply, base64_format: bool) -> bytes:
    out = []
    for item in reply.inputs:
        assert item.multi_vector is not None  # to_core asks for them
        out.append(floats(item.multi_vector, base64_format))  # (K, d)
    return dumps(out)


class MultiVectorRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        return [Route("POST", "/embed_multi", self.embed_multi, TEI,
                      "a multi-vector (ColBERT) model's vectors, or bge-m3's, [tokens, dim] per input, of queries "
                      "or documents",
                      MultiVectorBody, reply_schema={"type": "array", "items": {
                          "oneOf": [{"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                                    {"type": "string"}]}}, needs="embed_multi")]

    async def embed_multi(self, request: web.Request) -> web.Response:
        body, core_request = await self._bodies.read(request, MultiVectorBody, lambda b: (b, to_core(b)))
        base64_format = body.encoding_format == "base64"
        reply, _ = await self._core.encode(core_request, deadline(request), lambda r: render(r, base64_format),
                                           BASE64_FLOAT_BYTES if base64_format else JSON_FLOAT_BYTES)
        return json_response(reply)
