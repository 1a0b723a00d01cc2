"""attnserve's POST /embed_chunks: late chunking (engine/late_chunking.py). Each text is read whole and its chunks'
token embeddings mean-pooled; the reply has, per text, its own embedding and its chunks', in the order of the
spans (or of the chunker's cuts), each with its span and its token count."""

from __future__ import annotations

from aiohttp import web

from attnserve.engine.outputs import EncodeReply

from ..core import Core
from ..requests import EncodeRequest, LateChunking
from .attnserve_bodies import LateChunkingBody
from .errors import TEI
from .route import Route
from .wire import BASE64_FLOAT_BYTES, JSON_FLOAT_BYTES, BodyReader, deadline, dumps, floats, json_response

_VECTOR = {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}
REPLY_SCHEMA = {"type": "array", "items": {
    "type": "object", "required": ["embedding", "num_tokens", "windows", "chunks"],
    "properties": {
        "embedding": _VECTOR, "num_tokens": {"type": "integer"},
        "windows": {"type": "integer", "description": "the windows of max_seq_length tokens the text was read in"},
        "chunks": {"type": "array", "items": {
            "type": "object", "required": ["start", "stop", "num_tokens", "embedding"],
            "properties": {"start": {"type": "integer"}, "stop": {"type": "integer"},
                           "num_tokens": {"type": "integer"}, "embedding": _VECTOR}}}}}}


def to_core(body: LateChunkingBody) -> EncodeRequest:
    spans = [[tuple(span) for span in text] for text in body.spans] if body.spans is not None else None
    return EncodeRequest(inputs=[body.inputs] if isinstance(body.inputs, str) else body.inputs,
                         normalize=body.normalize, dimensions=body.dimensions, prompt_name=body.prompt_name,
                         prompt=body.prompt, task=body.task, model=body.model or None,
                         late_chunking=LateChunking(spans=spans, chunker=body.chunker, chunk_tokens=body.chunk_tokens))


def render(reply: EncodeReply, base64_format: bool) -> bytes:
    out = []
    for embedding, item in zip(reply.embeddings, reply.inputs, strict=True):
        out.append({"embedding": floats(embedding, base64_format), "num_tokens": item.num_tokens,
                    "windows": item.windows,
                    "chunks": [{"start": c.start, "stop": c.stop, "num_tokens": c.num_tokens,
                                "embedding": floats(c.embedding, base64_format)} for c in item.chunks or ()]})
    return dumps(out)


class LateChunkingRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        return [Route("POST", "/embed_chunks", self.embed_chunks, TEI,
                      "late chunking: each text read whole, then each chunk's token embeddings mean-pooled, beside "
                      "the text's own embedding", LateChunkingBody, reply_schema=REPLY_SCHEMA,
                      needs="late_chunking")]

    async def embed_chunks(self, request: web.Request) -> web.Response:
        body, core_request = await self._bodies.read(request, LateChunkingBody, lambda b: (b, to_core(b)))
        base64_format = body.encoding_format == "base64"
        reply, _ = await self._core.encode(core_request, deadline(request), lambda r: render(r, base64_format),
                                           BASE64_FLOAT_BYTES if base64_format else JSON_FLOAT_BYTES)
        return json_response(reply)
