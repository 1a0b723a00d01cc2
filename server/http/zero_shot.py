"""attnserve's POST /v1/zero_shot: zero-shot image classification by an image-text model (server/zero_shot.py):
each image's score for each candidate label, CLIP's softmax over the labels or SigLIP's sigmoid of each, best
first. Errors are OpenAI's envelope, as /v1/embeddings'."""

from __future__ import annotations

from aiohttp import web

from ..core import Core
from ..image_inputs import image_of
from ..zero_shot import ZeroShotReply, ZeroShotRequest
from .attnserve_bodies import ZeroShotBody
from .attnserve_bodies import ZeroShotReply as ZeroShotReplyBody
from .errors import OPENAI
from .route import Route
from .wire import BodyReader, deadline, dumps, json_response


def to_core(body: ZeroShotBody) -> ZeroShotRequest:
    return ZeroShotRequest(images=[image_of(image, f"images[{i}]") for i, image in enumerate(body.images)],
                           labels=body.labels, template=body.template, model=body.model or None)


def render(reply: ZeroShotReply) -> bytes:
    data = []
    for i, (scores, logits) in enumerate(zip(reply.scores, reply.logits, strict=True)):
        order = sorted(range(len(reply.labels)), key=lambda j: -float(scores[j]))
        data.append({"index": i, "scores": [{"label": reply.labels[j], "score": float(scores[j]),
                                             "logit": float(logits[j])} for j in order]})
    return dumps({"object": "list", "data": data, "activation": reply.activation, "model": reply.model,
                  "usage": {"prompt_tokens": reply.tokens, "total_tokens": reply.tokens}})


class ZeroShotRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        return [Route("POST", "/v1/zero_shot", self.zero_shot, OPENAI,
                      "zero-shot image classification: each image's score for each label (CLIP's softmax, SigLIP's "
                      "sigmoid)", ZeroShotBody, ZeroShotReplyBody, needs="embed_image")]

    async def zero_shot(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, ZeroShotBody, to_core)
        return json_response(render(await self._core.zero_shot(core_request, deadline(request))))
