"""Reranking over HTTP: TEI's POST /rerank and the Cohere/Infinity-style POST /v1/rerank, over core.rerank.

TEI's reply is a JSON list `[{index, score, text?}]`, best first. Cohere's and Infinity's `/v1/rerank` reply `{id,
results: [{index, relevance_score, document?}], model, usage}`, best first; they cut long documents rather than
refuse them, as both routes do unless the request says `truncate: false` or the server runs with
--long-inputs refuse (a pair is never chunked: --long-inputs chunk cuts it). A document is returned as Cohere's v1
API returns it: `{"text": ...}`.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from attnserve.engine.scores import RerankReply

from ..core import Core
from ..score_requests import RerankRequest
from .cohere_bodies import CohereRerankBody, CohereRerankReply, CohereV2RerankBody, CohereV2RerankReply
from .errors import OPENAI, TEI, WireNames
from .route import Route
from .tei_bodies import TeiRerankBody
from .wire import BodyReader, deadline, dumps, json_response

COHERE_NAMES = WireNames({"texts": "documents"})


def tei_request(body: TeiRerankBody) -> RerankRequest:
    return RerankRequest(query=body.query, texts=body.texts, raw_scores=body.raw_scores,
                         return_text=body.return_text, truncate=body.truncate,
                         truncation_direction=body.truncation_direction.lower(), model=body.model)


def cohere_request(body: CohereRerankBody) -> RerankRequest:
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    return RerankRequest(query=body.query, texts=texts, return_text=body.return_documents, truncate=body.truncate,
                         top_n=body.top_n, model=body.model)


def cohere_v2_request(body: CohereV2RerankBody) -> RerankRequest:
    # Cohere cuts long documents rather than refuse them: a pair over max_seq_length is cut.
    return RerankRequest(query=body.query, texts=body.documents, truncate=True, top_n=body.top_n,
                         model=body.model, max_tokens_per_doc=body.max_tokens_per_doc)


def render_cohere_v2(reply: RerankReply) -> bytes:
    return dumps({
        "id": str(uuid.uuid4()),
        "results": [{"index": r.index, "relevance_score": r.score} for r in reply.results],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    })


def render_tei(reply: RerankReply) -> bytes:
    return dumps([{"index": r.index, "score": r.score, **({"text": r.text} if r.text is not None else {})}
                  for r in reply.results])


def render_cohere(reply: RerankReply, model: str) -> bytes:
    return dumps({
        "id": str(uuid.uuid4()), "object": "rerank",
        "results": [{"index": r.index, "relevance_score": r.score,
                     **({"document": {"text": r.text}} if r.text is not None else {})} for r in reply.results],
        "model": model, "usage": {"prompt_tokens": reply.tokens, "total_tokens": reply.tokens},
    })


class RerankRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/rerank", self.tei, TEI, "score texts against a query with a reranker, best first (TEI)",
                  TeiRerankBody, reply_schema={"type": "array", "items": {"$ref": "#/components/schemas/TeiRank"}},
                  needs="rerank"),
            Route("POST", "/v1/rerank", self.cohere, OPENAI, "Cohere/Infinity-style reranking, best first",
                  CohereRerankBody, CohereRerankReply, names=COHERE_NAMES, needs="rerank"),
            Route("POST", "/v2/rerank", self.cohere_v2, OPENAI, "Cohere's v2 rerank (cohere.ClientV2.rerank), best "
                                                                "first", CohereV2RerankBody, CohereV2RerankReply,
                  names=COHERE_NAMES, needs="rerank"),
        ]

    async def tei(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiRerankBody, tei_request)
        reply = await self._core.rerank(core_request, deadline(request))
        return json_response(render_tei(reply))

    async def cohere_v2(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, CohereV2RerankBody, cohere_v2_request)
        reply = await self._core.rerank(core_request, deadline(request))
        return json_response(render_cohere_v2(reply))

    async def cohere(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, CohereRerankBody, cohere_request)
        reply = await self._core.rerank(core_request, deadline(request))
        return json_response(render_cohere(reply, reply.model))

