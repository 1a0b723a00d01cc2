"""OpenAI's embeddings API over the core: POST /v1/embeddings (also /embeddings), GET /v1/models[/{id}].

Images go in Jina's form (`input` of {"text": ...} and {"image": ...} objects) or vLLM's (`messages` whose content is
an image_url part), to an image-text model (CLIP, SigLIP), into the space its texts share.
POST /embeddings_image is Infinity's route for images alone.
Embeddings are L2-normalised, as OpenAI's are; `dimensions` keeps the first N dimensions before that
(Matryoshka). `usage` counts the tokens the model saw, special tokens included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

from attnserve.engine.outputs import EncodeReply
from attnserve.errors import InvalidInputError, ModelNotFoundError

from ..core import Core
from ..image_inputs import image_of
from ..requests import EncodeRequest
from .errors import OPENAI, WireNames
from .inputs import inputs_of, message_input
from .openai_bodies import InfinityImagesBody, OpenAIEmbeddingsBody, OpenAIEmbeddingsReply, OpenAIModel, OpenAIModelList
from .route import Route
from .wire import BASE64_FLOAT_BYTES, JSON_FLOAT_BYTES, BodyReader, InputMarks, deadline, dumps, floats, json_response

# The openai SDK sends only OpenAI's fields: attnserve's `truncate` goes in its extra_body.
NAMES = WireNames({"inputs": "input"},
                  truncate='set "truncate": true in the body (the openai SDK: extra_body={"truncate": True})')
OWNER = "attnserve"
Embeddings = TypeVar("Embeddings", OpenAIEmbeddingsBody, InfinityImagesBody)


def to_core(body: OpenAIEmbeddingsBody) -> EncodeRequest:
    if (body.input is None) == (body.messages is None):
        raise InvalidInputError("input: required (or vLLM's `messages`, not both)", field="input",
                                description="required (or messages, not both)")
    inputs = inputs_of(body.input) if body.input is not None else [message_input(body.messages or [])]
    return EncodeRequest(inputs=inputs, normalize=True,
                         truncate=body.truncate,  # None (not sent): as the server's --long-inputs says
                         dimensions=body.dimensions, prompt_name=body.prompt_name, prompt=body.prompt,
                         model=body.model, task=body.task, pooling=body.pooling)


def images_to_core(body: InfinityImagesBody) -> EncodeRequest:
    images = [body.input] if isinstance(body.input, str) else body.input
    return EncodeRequest(inputs=[image_of(image, "input" if isinstance(body.input, str) else f"input[{i}]", i)
                                 for i, image in enumerate(images)],
                         normalize=True, dimensions=body.dimensions, model=body.model)


def render(reply: EncodeReply, model: str, base64_format: bool) -> bytes:
    return dumps({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": floats(row, base64_format)}
                 for i, row in enumerate(reply.embeddings)],
        "model": model,
        "usage": {"prompt_tokens": reply.tokens, "total_tokens": reply.tokens},
    })


class OpenAIRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies
        self._created = int(time.time())

    def routes(self) -> list[Route]:
        def embeddings(path: str, summary: str) -> Route:
            return Route("POST", path, self.embeddings, OPENAI, summary, OpenAIEmbeddingsBody, OpenAIEmbeddingsReply,
                         names=NAMES, needs="embed")

        return [
            embeddings("/v1/embeddings", "OpenAI's embeddings API"),
            embeddings("/embeddings", "OpenAI's embeddings API (without /v1)"),
            Route("POST", "/embeddings_image", self.embeddings_image, OPENAI,
                  "Infinity's image embeddings: an image-text model's images, answered as OpenAI's embeddings",
                  InfinityImagesBody, OpenAIEmbeddingsReply, names=WireNames({"inputs": "input"}),
                  needs="embed_image"),
            Route("GET", "/v1/models", self.models, OPENAI, "every name of every model served, the default first",
                  reply=OpenAIModelList),
            Route("GET", "/v1/models/{id:.+}", self.model, OPENAI, "one served model's name", reply=OpenAIModel),
        ]

    async def embeddings(self, request: web.Request) -> web.Response:
        return await self._embed(request, OpenAIEmbeddingsBody, to_core)

    async def embeddings_image(self, request: web.Request) -> web.Response:
        return await self._embed(request, InfinityImagesBody, images_to_core)

    async def _embed(self, request: web.Request, model: type[Embeddings],
                     translate: Callable[[Embeddings], EncodeRequest]) -> web.Response:
        """A body of OpenAI's embeddings shape (or Infinity's images) through the core, answered in OpenAI's."""
        body, core_request = await self._bodies.read(request, model, lambda b: (b, translate(b)))
        base64_format = body.encoding_format == "base64"
        marks = InputMarks(lambda r: render(r, body.model, base64_format))
        reply, _ = await self._core.encode(core_request, deadline(request), marks,
                                           BASE64_FLOAT_BYTES if base64_format else JSON_FLOAT_BYTES)
        return json_response(reply, headers=marks.headers())

    async def models(self, request: web.Request) -> web.Response:
        return json_response(dumps({"object": "list", "data": [self._model(name) for name in self._core.models.names]}))

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["id"]
        if not name:
            raise ModelNotFoundError("no model named: ask for GET /v1/models/NAME")
        self._core.model(name)
        return json_response(dumps(self._model(name)))

    def _model(self, name: str) -> dict:
        info = self._core.model(name).info
        tower = {} if info.image_tower is None else {"image_tower": dict(zip(
            ("image_size", "patch_size", "num_layers", "num_heads", "max_patches"), info.image_tower, strict=True))}
        return {"id": name, "object": "model", "created": self._created, "owned_by": OWNER,
                "outputs": list(info.outputs), **tower}
