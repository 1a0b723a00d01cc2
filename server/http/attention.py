"""attnserve's own route: POST /v1/attention, the attention weights of texts or token ids, labelled with their
word pieces, as nested lists or base64 with their shape. The attention explorer calls it.

An image-text model's images ({"image": ...}, as /v1/embeddings takes them) get their image tower's maps over the
patches: the positions are labelled "<class>" (CLIP's class token) and "patch ROW,COL", and `image` says where each
lies in the image the tower takes (its boxes: top, left, bottom, right).
"""

from __future__ import annotations

from aiohttp import web

from attnserve.engine.outputs import EncodeReply

from ..core import Core
from ..requests import AttentionOptions, EncodeRequest
from .attnserve_bodies import AttentionBody, AttentionReply
from .errors import OPENAI, WireNames
from .inputs import inputs_of
from .route import Route
from .wire import BASE64_FLOAT_BYTES, JSON_FLOAT_BYTES, BodyReader, deadline, dumps, floats, json_response

NAMES = WireNames({"attention.": ""})


def to_core(body: AttentionBody) -> EncodeRequest:
    return EncodeRequest(
        inputs=inputs_of(body.inputs), truncate=body.truncate, truncation_direction=body.truncation_direction.lower(),
        attention=AttentionOptions(layers=body.layers, heads=body.heads, average_heads=body.average_heads,
                                   analyses=body.analyses, weights=body.weights),
        model=body.model)


def render(reply: EncodeReply, base64_format: bool) -> bytes:
    options = reply.options
    # to_core always asks for attention: the core resolved its layers and heads (every head when none was asked)
    assert options.attention_layers is not None and options.attention_heads is not None
    layers, heads = list(options.attention_layers), list(options.attention_heads)
    data = []
    for i, item in enumerate(reply.inputs):
        entry: dict[str, object] = {
            "index": i, "tokens": item.tokens, "num_tokens": item.num_tokens, "truncated": item.truncated,
            **({"pair_start": item.pair_start} if item.pair_start is not None else {}), "layers": layers,
            "heads": heads}
        if options.attention_reach is not None and item.layout is None:  # a text's: which cells its masks close
            entry["reach"] = [list(r) for r in options.attention_reach]
        if item.layout is not None:  # an image's: where each position (both axes) lies in the image its tower takes
            layout = item.layout
            entry["image"] = {"size": layout.side, "patch_size": layout.patch_size, "grid": layout.grid,
                              "height": layout.height,
                              "width": layout.width, "rows": layout.rows, "cols": layout.cols,
                              "class_token": layout.class_token, "fit": layout.fit, "boxes": layout.boxes().tolist()}
        if item.attentions is not None:  # unless weights false
            entry |= {"shape": list(item.attentions.shape), "attentions": floats(item.attentions, base64_format)}
        if "rollout" in item.analyses:
            entry["rollout"] = floats(item.analyses["rollout"], base64_format)  # type: ignore[arg-type]
        if "head_stats" in item.analyses:
            entry["head_stats"] = {name: floats(grid, base64_format)
                                   for name, grid in item.analyses["head_stats"].items()}  # type: ignore[attr-defined]
        for name in ("norms", "norms_summed"):
            if name in item.analyses:
                entry[name] = floats(item.analyses[name], base64_format)  # type: ignore[arg-type]
        data.append(entry)
    return dumps({
        "object": "list",
        "model": reply.model,
        "data": data,
        "usage": {"prompt_tokens": reply.tokens, "total_tokens": reply.tokens},
    })


class AttentionRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        return [Route("POST", "/v1/attention", self.attention, OPENAI,
                      "attention weights [layers, heads or 1, tokens, tokens] with the word pieces", AttentionBody,
                      AttentionReply, names=NAMES, needs="attention")]

    async def attention(self, request: web.Request) -> web.Response:
        body, core_request = await self._bodies.read(request, AttentionBody, lambda b: (b, to_core(b)))
        base64_format = body.encoding_format == "base64"
        reply, _ = await self._core.encode(core_request, deadline(request), lambda r: render(r, base64_format),
                                           BASE64_FLOAT_BYTES if base64_format else JSON_FLOAT_BYTES)
        return json_response(reply)
