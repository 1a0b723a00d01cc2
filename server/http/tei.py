"""text-embeddings-inference's routes over the core, in TEI's request and reply shapes, so that TEI's clients work
unchanged: POST /embed (also POST /, as TEI answers it for an embedding model), /embed_all, /tokenize, /decode;
GET /info and /health. A TEI server serves one model, and TEI's bodies name none: these routes serve the default
model, or the one a body names in `model` (attnserve's field; a name not served is refused, never ignored).
"""

from __future__ import annotations

import json

from aiohttp import web

from attnserve.engine.output_options import SparseOptions
from attnserve.engine.outputs import EncodeReply
from attnserve.engine.scores import PredictReply
from attnserve.errors import InvalidInputError

from ..core import Core
from ..image_inputs import image_of
from ..models import DTYPE_NAMES
from ..requests import EncodeRequest, Input
from ..score_requests import PredictRequest, SimilarityRequest
from ..token_requests import DecodeRequest, TokenizeRequest
from .bodies import JinaImage
from .errors import TEI, WireNames
from .inputs import inputs_of
from .route import Route
from .tei_bodies import (
    TeiDecodeBody,
    TeiEmbedAllBody,
    TeiEmbedBody,
    TeiEmbedSparseBody,
    TeiInfo,
    TeiPredictBody,
    TeiSimilarityBody,
    TeiTokenizeBody,
)
from .wire import JSON_FLOAT_BYTES, BodyReader, InputMarks, deadline, dumps, floats, json_response

# TEI's /similarity nests its texts under "inputs".
SIMILARITY_NAMES = WireNames({"source_sentence": "inputs.source_sentence", "sentences": "inputs.sentences"})


def _list_of(schema: dict) -> dict:
    return {"type": "array", "items": schema}


_FLOATS = _list_of({"type": "number"})


def embed_request(body: TeiEmbedBody) -> EncodeRequest:
    return EncodeRequest(inputs=inputs_of(body.inputs), normalize=body.normalize, truncate=body.truncate,
                         truncation_direction=body.truncation_direction.lower(), dimensions=body.dimensions,
                         prompt_name=body.prompt_name, prompt=body.prompt, task=body.task,
                         embedding_types=(body.embedding_type,), ranges=body.ranges, model=body.model,
                         pooling=body.pooling)


def embed_all_request(body: TeiEmbedAllBody) -> EncodeRequest:
    return EncodeRequest(inputs=inputs_of(body.inputs), truncate=body.truncate,
                         truncation_direction=body.truncation_direction.lower(), token_embeddings=True,
                         prompt_name=body.prompt_name, prompt=body.prompt, model=body.model)


def embed_sparse_request(body: TeiEmbedSparseBody) -> EncodeRequest:
    return EncodeRequest(inputs=inputs_of(body.inputs), truncate=body.truncate,
                         truncation_direction=body.truncation_direction.lower(), prompt_name=body.prompt_name,
                         prompt=body.prompt, sparse=SparseOptions(body.top_k, body.return_tokens), model=body.model)


def render_sparse(reply: EncodeReply) -> bytes:
    """TEI's shape: per input, its [{index, value}] in index order (with each `token` when asked)."""
    out = []
    for item in reply.inputs:
        sparse = item.sparse
        assert sparse is not None  # embed_sparse_request asks for it
        if sparse.tokens is None:
            out.append([{"index": i, "value": v} for i, v in zip(sparse.indices.tolist(), sparse.values.tolist(),
                                                                  strict=True)])
        else:
            out.append([{"index": i, "value": v, "token": t} for i, v, t in zip(
                sparse.indices.tolist(), sparse.values.tolist(), sparse.tokens, strict=True)])
    return dumps(out)


def predict_inputs(inputs: str | list) -> tuple[list[str | tuple[str, str]], bool]:
    """TEI's /predict inputs -> (the core's inputs, whether they were a batch). A text, or a list of exactly two
    texts (one pair), is one input; any other list is a batch, of texts or of [text] / [a, b] lists."""
    if isinstance(inputs, str):
        return [inputs], False
    if len(inputs) == 2 and all(isinstance(x, str) for x in inputs):
        return [(inputs[0], inputs[1])], False
    batch: list[str | tuple[str, str]] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            batch.append(item)
        elif len(item) == 1:
            batch.append(item[0])
        elif len(item) == 2:
            batch.append((item[0], item[1]))
        else:
            problem = f"a text or a pair takes 1 or 2 strings, got {len(item)}"
            raise InvalidInputError(f"input {i}: {problem}", field=f"inputs[{i}]", description=problem)
    return batch, True


def predict_request(body: TeiPredictBody) -> tuple[PredictRequest, bool]:
    inputs, batch = predict_inputs(body.inputs)
    return PredictRequest(inputs=inputs, raw_scores=body.raw_scores, truncate=body.truncate,
                          truncation_direction=body.truncation_direction.lower(), model=body.model), batch


def render_predictions(reply: PredictReply, batch: bool) -> bytes:
    predictions = [[{"score": score, "label": label} for label, score in p] for p in reply.predictions]
    return dumps(predictions if batch else predictions[0])


def _similarity_option(body: TeiSimilarityBody, name: str):
    """An option of /similarity from TEI's `parameters` or the top level (attnserve's older place): one of them."""
    top, nested = getattr(body, name), getattr(body.parameters, name) if body.parameters else None
    if top is not None and nested is not None:
        description = (f"{json.dumps(nested)} here and {json.dumps(top)} at the top level: give it once (TEI's place "
                       "is parameters)")
        raise InvalidInputError(f"parameters.{name}: {description}", field=f"parameters.{name}",
                                description=description)
    return nested if nested is not None else top


def similarity_request(body: TeiSimilarityBody) -> SimilarityRequest:
    direction = _similarity_option(body, "truncation_direction") or "Right"
    def sentence(value: str | JinaImage, field: str) -> Input:
        return value if isinstance(value, str) else image_of(value.image, field)

    return SimilarityRequest(source_sentence=sentence(body.inputs.source_sentence, "inputs.source_sentence.image"),
                             sentences=[sentence(s, f"inputs.sentences[{i}].image")
                                        for i, s in enumerate(body.inputs.sentences)],
                             truncate=_similarity_option(body, "truncate"), truncation_direction=direction.lower(),
                             prompt_name=_similarity_option(body, "prompt_name"),
                             prompt=_similarity_option(body, "prompt"), model=body.model)


def _id_lists(ids: list) -> list[list[int]]:
    """One input's token ids, or several inputs' (TeiDecodeBody has checked the form; this tells them apart)."""
    return [ids] if ids and isinstance(ids[0], int) else ids


def render_embeddings(reply: EncodeReply) -> bytes:
    kind = reply.options.embedding_types[0]
    if kind == "float":
        return dumps(floats(reply.embeddings, False))  # (N, D) as N lists
    return dumps(reply.typed[kind])  # (N, D) integers, or (N, D / 8) bytes of the binary types


def render_token_embeddings(reply: EncodeReply) -> bytes:
    arrays = []
    for item in reply.inputs:
        assert item.token_embeddings is not None  # embed_all_request asks for them
        arrays.append(floats(item.token_embeddings, False))  # (T, H)
    return dumps(arrays)  # N of (T, H)


def _model_type(info) -> dict:
    """TEI's model_type: an embedding model's pooling, or a reranker's (one label) or a classifier's labels (TEI's
    clients read it to tell which routes the model answers)."""
    if info.kind == "reranker":
        labels = info.labels or tuple(f"LABEL_{i}" for i in range(info.num_labels))
        return {"reranker" if info.num_labels == 1 else "classifier": {
            "id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)}}}
    return {"embedding": {"pooling": info.pooling}}


class TeiRoutes:
    def __init__(self, core: Core, bodies: BodyReader):
        self._core, self._bodies = core, bodies

    def routes(self) -> list[Route]:
        def embed(path: str, summary: str) -> Route:
            return Route("POST", path, self.embed, TEI, summary, TeiEmbedBody, reply_schema=_list_of(_FLOATS),
                         needs="embed")

        # TEI's / is the default model's own route: embeddings for an embedding model, predictions for a reranker
        # or a classifier; a model with neither (ColBERT, Qwen3-Reranker) has none there (405, Allow: GET).
        outputs = self._core.info.outputs
        root = ([embed("/", "sentence embeddings (TEI's route for an embedding model)")] if "embed" in outputs
                else [Route("POST", "/", self.predict, TEI, "a reranker's or classifier's scores (TEI's route for "
                            "them, as /predict)", TeiPredictBody, reply_schema={"type": "array"}, needs="predict")]
                if "predict" in outputs else [])
        return [
            embed("/embed", "sentence embeddings (TEI)"),
            *root,
            Route("POST", "/embed_all", self.embed_all, TEI, "token embeddings, [tokens, hidden] per input (TEI)",
                  TeiEmbedAllBody, reply_schema=_list_of(_list_of(_FLOATS)), needs="embed"),
            Route("POST", "/embed_sparse", self.embed_sparse, TEI, "a SPLADE model's sparse embeddings, [{index, "
                                                                    "value}] per input (TEI)", TeiEmbedSparseBody,
                  reply_schema=_list_of(_list_of({"type": "object"})), needs="embed_sparse"),
            Route("POST", "/predict", self.predict, TEI, "a classifier's scores for each text or pair, every label "
                                                         "best first (TEI)", TeiPredictBody,
                  reply_schema={"type": "array"}, needs="predict"),
            Route("POST", "/similarity", self.similarity, TEI, "the cosine of each sentence with source_sentence (TEI)",
                  TeiSimilarityBody, reply_schema=_FLOATS, names=SIMILARITY_NAMES, needs="similarity"),
            Route("POST", "/tokenize", self.tokenize, TEI, "every token of each whole text, with its characters (TEI)",
                  TeiTokenizeBody, reply_schema=_list_of(_list_of({"$ref": "#/components/schemas/TeiToken"}))),
            Route("POST", "/decode", self.decode, TEI, "token ids back to text (TEI)", TeiDecodeBody,
                  reply_schema=_list_of({"type": "string"})),
            Route("GET", "/info", self.info, TEI, "the model and the server's limits (TEI)", reply=TeiInfo),
            Route("GET", "/health", self.health, TEI, "200 (no body) when serving; 503 before warm-up and while "
                                                       "draining", open=True, readiness=True),
        ]

    async def embed(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiEmbedBody, embed_request)
        marks = InputMarks(render_embeddings)
        reply, _ = await self._core.encode(core_request, deadline(request), marks, JSON_FLOAT_BYTES)
        return json_response(reply, headers=marks.headers())

    async def embed_all(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiEmbedAllBody, embed_all_request)
        reply, _ = await self._core.encode(core_request, deadline(request), render_token_embeddings,
                                           JSON_FLOAT_BYTES)
        return json_response(reply)

    async def embed_sparse(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiEmbedSparseBody, embed_sparse_request)
        reply, _ = await self._core.encode(core_request, deadline(request), render_sparse, JSON_FLOAT_BYTES)
        return json_response(reply)

    async def predict(self, request: web.Request) -> web.Response:
        core_request, batch = await self._bodies.read(request, TeiPredictBody, predict_request)
        reply = await self._core.predict(core_request, deadline(request))
        return json_response(render_predictions(reply, batch))

    async def similarity(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiSimilarityBody, similarity_request)
        reply = await self._core.similarity(core_request, deadline(request))
        return json_response(dumps(reply.scores))

    async def tokenize(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiTokenizeBody, lambda b: TokenizeRequest(
            [b.inputs] if isinstance(b.inputs, str) else b.inputs, b.add_special_tokens, b.prompt_name, b.prompt,
            b.model))
        return json_response(dumps(await self._core.tokenize(core_request)))  # Token dataclasses, as TEI's

    async def decode(self, request: web.Request) -> web.Response:
        core_request = await self._bodies.read(request, TeiDecodeBody, lambda b: DecodeRequest(
            _id_lists(b.ids), b.skip_special_tokens, b.model))
        return json_response(dumps(await self._core.decode(core_request)))

    async def info(self, request: web.Request) -> web.Response:
        info = self._core.info
        return json_response(dumps({
            "model_id": info.model, "model_sha": None, "model_dtype": DTYPE_NAMES.get(info.precision, info.precision),
            "model_type": _model_type(info), "served_model_name": info.model,
            # The queue is bounded in tokens, not requests: each queued input holds a token at least, so no more
            # requests than its tokens are ever in it at once.
            "max_concurrent_requests": info.max_queue_tokens,
            "max_input_length": info.max_seq_length, "max_batch_tokens": info.max_batch_tokens,
            "max_batch_requests": info.max_batch_size, "max_client_batch_size": info.max_inputs_per_request,
            "auto_truncate": info.auto_truncate, "long_inputs": info.long_inputs,
            "tokenization_workers": self._core.workers,
            "version": info.version, "sha": None, "docker_label": None,
            "outputs": list(info.outputs), "embedding_types": list(info.embedding_types)}))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)  # the door answered 503 for it unless ready (Route.readiness)
