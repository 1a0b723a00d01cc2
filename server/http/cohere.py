"""Cohere's v2 embed API over the core: POST /v2/embed, so that Cohere's SDK (ClientV2(base_url=...).embed) works
unchanged.

`embedding_types` asks for several encodings of the same vectors at once (engine/quantize.py): float, int8, uint8,
binary, ubinary, and base64 (the float32 bytes of each vector). `output_dimension` cuts them first (Matryoshka),
then they are normalised as the model's pipeline says, then quantized. `truncate` END (Cohere's default) cuts an
input's end, START its start, NONE refuses it. `input_type` picks the model's prompt of that purpose where it has
one. Errors are OpenAI's envelope, as the Cohere-style /v1/rerank's. An image-text model (CLIP, SigLIP) takes
`images` (data URIs; input_type image) and `inputs` (content parts: a text or an image_url each), embedded in the
space its texts share.
"""

from __future__ import annotations

import copy
import uuid

from aiohttp import web

from attnserve.engine.outputs import EncodeReply
from attnserve.errors import InvalidInputError

from ..core import Core
from ..image_inputs import image_of
from ..requests import EncodeRequest, Input
from .bodies import ContentText
from .cohere_bodies import CohereEmbedBody, CohereEmbedReply
from .errors import OPENAI, WireNames
from .route import Route
from .wire import JSON_FLOAT_BYTES, BodyReader, InputMarks, deadline, dumps, floats, json_response

# int8 / uint8 ranges are the model's here (Cohere's API takes none): an error about them is about the types asked.
# The core's "inputs" is the body's texts, images or inputs, whichever it sent: renamed per request (embed()).
NAMES = WireNames({"dimensions": "output_dimension", "ranges": "embedding_types"},
                  truncate='set "truncate" to "END" or "START"')
# Cohere's input types -> the prompt names a model may have for them, first found wins.
PROMPTS = {"search_query": ("query", "search_query"), "search_document": ("document", "passage", "search_document"),
           "classification": ("classification",), "clustering": ("clustering",)}
TRUNCATE = {"NONE": (False, "right"), "START": (True, "left"), "END": (True, "right"), None: (True, "right")}


def _invalid(field: str, description: str) -> InvalidInputError:
    return InvalidInputError(description, field=field, description=description)


def to_core(body: CohereEmbedBody, prompts: dict[str, str], max_seq_length: int) -> EncodeRequest:
    given = [name for name in ("texts", "images", "inputs") if getattr(body, name) is not None]
    if len(given) != 1:
        raise _invalid("inputs", "send one of `texts`, `images` (an image-text model's) or `inputs`"
                       + (f", not {' and '.join(given)}" if given else ""))
    inputs: list[Input]
    if body.images is not None:  # an image-text model's (the core refuses images to a text model, naming it)
        if body.input_type not in (None, "image"):
            raise _invalid("input_type", f"input_type {body.input_type} is for texts: images take input_type image")
        inputs = [image_of(image, f"images[{i}]", i) for i, image in enumerate(body.images)]
    elif body.inputs is not None:
        inputs = [_content(entry.content, i) for i, entry in enumerate(body.inputs)]
    else:
        if body.input_type == "image":
            raise _invalid("input_type", "input_type image is for `images`: texts take a text input_type")
        inputs = list(body.texts or [])
    if body.max_tokens is not None and body.max_tokens < max_seq_length:
        raise _invalid("max_tokens", f"max_tokens {body.max_tokens} is not supported: inputs are cut at the "
                                     f"model's max_seq_length {max_seq_length}; leave it unset")
    names = [name for name in PROMPTS.get(body.input_type or "", ()) if name in prompts]
    truncate, direction = TRUNCATE[body.truncate]
    types = [("float" if kind == "base64" else kind) for kind in (body.embedding_types or ["float"])]
    return EncodeRequest(inputs=inputs, truncate=truncate, truncation_direction=direction,
                         dimensions=body.output_dimension, prompt_name=names[0] if names else None,
                         model=body.model, embedding_types=types)


def _content(parts: list, row: int) -> Input:
    """One `inputs` entry's content -> its input: one text part or one image part (an image-text model embeds
    either, not both as one)."""
    if len(parts) != 1:
        raise _invalid(f"inputs[{row}].content", f"{len(parts)} content parts: an image-text model embeds one text "
                                                  "or one image an input")
    part = parts[0]
    if isinstance(part, ContentText):
        return part.text
    return image_of(part.image_url.url, f"inputs[{row}].content[0].image_url.url", row)


def render(reply: EncodeReply, body: CohereEmbedBody) -> bytes:
    embeddings: dict[str, object] = {}
    for kind in body.embedding_types or ["float"]:
        if kind == "base64":
            embeddings[kind] = [floats(row, True) for row in reply.embeddings]
        else:
            embeddings[kind] = reply.typed[kind]  # (N, D) or (N, D / 8): orjson writes the lists
    return dumps({"id": str(uuid.uuid4()), "embeddings": embeddings, "texts": list(body.texts or []),
                  "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": reply.tokens}},
                  "response_type": "embeddings_by_type"})


class CohereRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        return [Route("POST", "/v2/embed", self.embed, OPENAI,
                      "Cohere's v2 embed API: float, int8, uint8, binary, ubinary and base64 embeddings",
                      CohereEmbedBody, CohereEmbedReply, names=NAMES, needs="embed")]

    async def embed(self, request: web.Request) -> web.Response:
        def translate(body: CohereEmbedBody) -> tuple[CohereEmbedBody, EncodeRequest]:
            info = self._core.model(body.model).info
            return body, to_core(body, info.prompts, info.max_seq_length)

        body, core_request = await self._bodies.read(request, CohereEmbedBody, translate)
        marks = InputMarks(lambda r: render(r, body))
        try:
            reply, _ = await self._core.encode(core_request, deadline(request), marks, JSON_FLOAT_BYTES)
        except InvalidInputError as error:
            raise _named(error, "images" if body.images is not None else "inputs" if body.inputs is not None
                         else "texts") from None
        return json_response(reply, headers=marks.headers())


def _named(error: InvalidInputError, field: str) -> InvalidInputError:
    """An error of the core's about its inputs, named by the body's field that sent them: texts, images or
    inputs (an `inputs` entry's text is its content's part)."""
    neutral = error.field
    if neutral is not None and neutral.startswith("inputs"):
        error = copy.copy(error)
        rest = neutral[len("inputs"):]
        if field == "inputs" and rest.endswith((".text", ".token_ids")):
            rest = rest.rsplit(".", 1)[0] + ".content[0]"
        error.field = field + rest
    return error
