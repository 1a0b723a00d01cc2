"""The attnserve.v1.Encoder servicer: the gRPC door over the core (core.py). It translates protobuf to the
core's requests and the core's replies to protobuf, and nothing else: no rule, limit or batching lives here.

The reply is serialized in the core's thread-pool job, never on the event loop; Embed and EmbedStream
therefore hand grpc already-serialized bytes, which the request guard (guard.py) sends as they are. The
methods are registered by the generated add_EncoderServicer_to_server (add_to_server). The deadline is the
call's, run under by the core as on every door.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import numpy as np

from attnserve.engine.output_options import SparseOptions
from attnserve.engine.outputs import EncodeReply
from attnserve.engine.scores import PredictReply, RerankReply
from attnserve.errors import InvalidInputError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from ..core import Core, ModelInfo
from ..image_inputs import ImageBytes, ImageUrl
from ..metrics import Metrics
from ..requests import AttentionOptions, EncodeRequest, Input, LateChunking
from ..score_requests import PredictRequest, RerankRequest, SimilarityRequest
from .calls import Calls, deadline

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Encoder"].full_name  # "attnserve.v1.Encoder"
# Each method's request message ("Rerank" -> "RerankRequest"): the errors that name a field name its message.
REQUEST_TYPES = {m.name: m.input_type.name for m in pb.DESCRIPTOR.services_by_name["Encoder"].methods}
PROTOCOL = "grpc"

# Requests of one stream in flight at once: enough to fill batches from a
# single streaming client, bounded so a fast sender cannot queue without limit.

POOLING = {pb.POOLING_DEFAULT: "default", pb.MEAN: "mean", pb.CLS: "cls"}
TRUNCATION_DIRECTION = {pb.TRUNCATE_RIGHT: "right", pb.TRUNCATE_LEFT: "left"}
EMBEDDING_TYPE = {pb.EMBEDDING_TYPE_FLOAT: "float", pb.EMBEDDING_TYPE_INT8: "int8", pb.EMBEDDING_TYPE_UINT8: "uint8",
                  pb.EMBEDDING_TYPE_BINARY: "binary", pb.EMBEDDING_TYPE_UBINARY: "ubinary"}
INPUT_TYPE = {pb.INPUT_TYPE_DOCUMENT: "document", pb.INPUT_TYPE_QUERY: "query"}


class _Inputs(Sequence[Input]):
    """A request's inputs as the core reads them: a text, token ids or None; converted as they are read, in the
    core's thread pool."""

    def __init__(self, inputs):
        self._inputs = inputs

    def __len__(self) -> int:
        return len(self._inputs)

    def __getitem__(self, i):
        item = self._inputs[i]
        kind = item.WhichOneof("content")
        if kind == "pair":
            return (item.pair.a, item.pair.b)
        if kind == "image":  # an image-text model's: its bytes (checked when prepared) or a URL the core fetches
            image = item.image
            if image.WhichOneof("source") == "url":
                return ImageUrl(image.url)
            return ImageBytes(image.data, image.mime_type or None)
        return item.text if kind == "text" else item.token_ids.ids if kind == "token_ids" else None


def to_core(request: pb.EmbedRequest) -> EncodeRequest:
    attention = None
    if request.HasField("attention"):
        a = request.attention
        attention = AttentionOptions(layers=a.layers, heads=a.heads, average_heads=a.average_heads,
                                     analyses=list(a.analyses), weights=a.weights if a.HasField("weights") else True)
    return EncodeRequest(
        inputs=_Inputs(request.inputs),
        pooling=POOLING.get(request.pooling, request.pooling),
        normalize=request.normalize if request.HasField("normalize") else None,
        truncate=request.truncate if request.HasField("truncate") else None,  # None: the server's default
        truncation_direction=TRUNCATION_DIRECTION.get(request.truncation_direction, request.truncation_direction),
        dimensions=request.dimensions if request.HasField("dimensions") else None,
        token_embeddings=request.return_token_embeddings,
        attention=attention,
        prompt_name=request.prompt_name if request.HasField("prompt_name") else None,
        prompt=request.prompt if request.HasField("prompt") else None,
        model=request.model or None,
        task=request.task if request.HasField("task") else None,
        embedding_types=(EMBEDDING_TYPE.get(request.embedding_type, str(int(request.embedding_type))),),
        ranges=_ranges(request.ranges) if request.HasField("ranges") else None,
        sparse=SparseOptions(request.sparse.top_k if request.sparse.HasField("top_k") else None,
                             request.sparse.return_tokens) if request.HasField("sparse") else None,
        multi_vector=INPUT_TYPE.get(request.multi_vector.input_type, str(int(request.multi_vector.input_type)))
        if request.HasField("multi_vector") else None,
        late_chunking=_late_chunking(request.late_chunking) if request.HasField("late_chunking") else None)


def _late_chunking(late: pb.LateChunking) -> LateChunking:
    """Spans (when any is given) or a chunker (an empty name is none: the core asks for one of the two)."""
    spans = [[(span.start, span.stop) for span in text.spans] for text in late.spans] if late.spans else None
    return LateChunking(spans=spans, chunker=late.chunker or None,
                        chunk_tokens=late.chunk_tokens if late.HasField("chunk_tokens") else None)


def _ranges(t: pb.Tensor):
    """A request's [2, D] FLOAT32 ranges; the core checks the shape against the embeddings returned."""
    if t.dtype != pb.FLOAT32 or len(t.shape) != 2 or min(t.shape) < 0 or len(t.data) != 4 * int(np.prod(t.shape)):
        problem = "ranges must be a [2, D] FLOAT32 tensor whose data holds its shape's floats"
        raise InvalidInputError(problem, field="ranges", description=problem)
    return np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))


def tensor(array: np.ndarray) -> pb.Tensor:
    """Row-major little-endian float32, as numpy's tobytes() gives it."""
    a = np.ascontiguousarray(array, dtype="<f4")
    return pb.Tensor(shape=a.shape, dtype=pb.FLOAT32, data=a.tobytes())


def codes(array: np.ndarray) -> pb.Tensor:
    """A quantized embedding: int8 or uint8 bytes, as numpy's tobytes() gives them."""
    return pb.Tensor(shape=array.shape, dtype=pb.INT8 if array.dtype == np.int8 else pb.UINT8,
                     data=np.ascontiguousarray(array).tobytes())


def render(reply: EncodeReply) -> bytes:
    out = pb.EmbedResponse(model=reply.model)
    kind = reply.options.embedding_types[0]
    sentences = reply.embeddings if kind == "float" else reply.typed[kind]
    for sentence, item in zip(sentences, reply.inputs, strict=True):
        # windows only where there were several: 0 (whole, as the proto says) is left off the wire
        embedding = out.embeddings.add(num_tokens=item.num_tokens, truncated=item.truncated,
                                       windows=item.windows if item.windows > 1 else 0)
        if item.sparse is not None:  # a SPLADE model's weights (instead of its vocabulary-sized vector), bge-m3's
            embedding.sparse_embedding.CopyFrom(pb.SparseEmbedding(
                indices=item.sparse.indices.tolist(), values=item.sparse.values.tolist(),
                tokens=item.sparse.tokens or []))
        if item.multi_vector is not None:  # a ColBERT model's vectors (instead of an embedding), bge-m3's
            embedding.multi_vector.CopyFrom(tensor(item.multi_vector))  # [tokens, dim]
        if not reply.options.dense:
            continue
        for chunk in item.chunks or ():
            embedding.chunks.add(start=chunk.start, stop=chunk.stop, num_tokens=chunk.num_tokens,
                                 embedding=tensor(chunk.embedding))
        if sentence.size:  # a reranker has none: its reply is the attention of its pairs
            embedding.sentence_embedding.CopyFrom(tensor(sentence) if kind == "float" else codes(sentence))
        if item.token_embeddings is not None:
            embedding.token_embeddings.CopyFrom(tensor(item.token_embeddings))
        if item.attentions is not None:
            embedding.attentions.CopyFrom(tensor(item.attentions))
        if "rollout" in item.analyses:
            embedding.analyses.rollout.CopyFrom(tensor(item.analyses["rollout"]))  # type: ignore[arg-type]
        for name, grid in item.analyses.get("head_stats", {}).items():  # type: ignore[attr-defined]
            embedding.analyses.head_stats[name].CopyFrom(tensor(grid))
        if "norms" in item.analyses:
            embedding.analyses.norms.CopyFrom(tensor(item.analyses["norms"]))  # type: ignore[arg-type]
            embedding.analyses.norms_summed.CopyFrom(tensor(item.analyses["norms_summed"]))  # type: ignore[arg-type]
        if item.tokens is not None:
            embedding.tokens.extend(item.tokens)
        if item.pair_start is not None:
            embedding.pair_start = item.pair_start
        if reply.options.attention_reach is not None and item.layout is None:  # a text's: what its masks close
            embedding.reach.extend(pb.LayerReach(behind=behind, ahead=ahead)
                                   for behind, ahead in reply.options.attention_reach)
        if item.layout is not None:  # an image's: where the maps' positions lie
            layout = item.layout
            embedding.patches.CopyFrom(pb.PatchPositions(
                image_size=layout.side or 0, patch_size=layout.patch_size, grid=layout.grid or 0,
                class_token=layout.class_token,
                boxes=layout.boxes().ravel().tolist(), fit=layout.fit, height=layout.height, width=layout.width,
                rows=layout.rows, cols=layout.cols))
    return out.SerializeToString()


def model_info(info: ModelInfo) -> pb.ModelInfo:
    return pb.ModelInfo(
        model=info.model, hidden_size=info.hidden_size, embedding_size=info.embedding_size,
        num_layers=info.num_layers, num_heads=info.num_heads,
        max_seq_length=info.max_seq_length, vocab_size=info.vocab_size, pooling=info.pooling,
        normalize=info.normalize, provider=info.provider, precision=info.precision, version=info.version,
        limits=pb.ServerLimits(
            max_inputs_per_request=info.max_inputs_per_request, max_batch_tokens=info.max_batch_tokens,
            max_batch_size=info.max_batch_size, max_queue_tokens=info.max_queue_tokens,
            max_request_bytes=info.max_request_bytes, max_response_bytes=info.max_response_bytes,
            max_wait_ms=info.max_wait_ms, max_queue_wait_ms=info.max_queue_wait_ms,
            auto_truncate=info.auto_truncate, long_inputs=info.long_inputs),
        kind=info.kind, num_labels=info.num_labels, names=info.names, prompts=info.prompts,
        default_prompt_name=info.default_prompt_name or "", tasks=info.tasks, labels=info.labels,
        outputs=info.outputs, embedding_types=info.embedding_types, multi_vector_size=info.multi_vector_size,
        image_tower=None if info.image_tower is None else pb.ImageTower(
            image_size=info.image_tower[0], patch_size=info.image_tower[1], num_layers=info.image_tower[2],
            num_heads=info.image_tower[3], max_patches=info.image_tower[4]))


def classify_to_core(request: pb.ClassifyRequest) -> PredictRequest:
    return PredictRequest(
        inputs=_Inputs(request.inputs), raw_scores=request.raw_scores,  # type: ignore[arg-type]
        truncate=request.truncate if request.HasField("truncate") else None,
        truncation_direction=TRUNCATION_DIRECTION.get(request.truncation_direction, request.truncation_direction),
        model=request.model or None)


def render_predictions(reply: PredictReply) -> pb.ClassifyResponse:
    return pb.ClassifyResponse(model=reply.model, predictions=[
        pb.Prediction(scores=[pb.LabelScore(label=label, score=score) for label, score in prediction])
        for prediction in reply.predictions])


def similarity_to_core(request: pb.SimilarityRequest) -> SimilarityRequest:
    return SimilarityRequest(
        source_sentence=request.source_sentence, sentences=request.sentences,
        truncate=request.truncate if request.HasField("truncate") else None,
        truncation_direction=TRUNCATION_DIRECTION.get(request.truncation_direction, request.truncation_direction),
        prompt_name=request.prompt_name if request.HasField("prompt_name") else None,
        prompt=request.prompt if request.HasField("prompt") else None, model=request.model or None)


def rerank_to_core(request: pb.RerankRequest) -> RerankRequest:
    return RerankRequest(
        query=request.query, texts=request.texts, raw_scores=request.raw_scores, return_text=request.return_text,
        truncate=request.truncate if request.HasField("truncate") else None,
        truncation_direction=TRUNCATION_DIRECTION.get(request.truncation_direction, request.truncation_direction),
        top_n=request.top_n if request.HasField("top_n") else None, model=request.model or None)


def render_rerank(reply: RerankReply) -> pb.RerankResponse:
    out = pb.RerankResponse(model=reply.model)
    for result in reply.results:
        item = out.results.add(index=result.index, score=result.score)
        if result.text is not None:
            item.text = result.text
    return out


class EncoderService(encoder_pb2_grpc.EncoderServicer):
    def __init__(self, core: Core, metrics: Metrics):
        self._core = core
        self._calls = Calls(core, metrics, PROTOCOL, REQUEST_TYPES)

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> bytes:
        return await self._calls.unary("Embed", len(request.inputs), context, lambda: self._embed(request, context))

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest], context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[bytes]:
        """Requests are taken as they come and run concurrently; replies go back in request order (Calls.stream).

        An error ends the stream after the replies to the requests before it, naming the request it answers.
        """
        async for reply in self._calls.stream("EmbedStream", requests, context,
                                              lambda request: self._embed(request, context)):
            yield reply

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        return await self._calls.quick("GetModelInfo", context,
                                       lambda: model_info(self._core.model(request.model).info))

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext) -> pb.ModelList:
        return await self._calls.quick("ListModels", context, lambda: pb.ModelList(
            models=[model_info(model.info) for model in self._core.models.all]))

    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        async def rerank() -> tuple[pb.RerankResponse, int]:
            reply = await self._core.rerank(rerank_to_core(request), deadline(context))
            return render_rerank(reply), reply.tokens

        return await self._calls.unary("Rerank", len(request.texts), context, rerank)

    async def Similarity(self, request: pb.SimilarityRequest, context: grpc.aio.ServicerContext
                         ) -> pb.SimilarityResponse:
        async def similarity() -> tuple[pb.SimilarityResponse, int]:
            reply = await self._core.similarity(similarity_to_core(request), deadline(context))
            return pb.SimilarityResponse(scores=reply.scores.tolist(), model=reply.model), reply.tokens

        return await self._calls.unary("Similarity", 1 + len(request.sentences), context, similarity)

    async def Classify(self, request: pb.ClassifyRequest, context: grpc.aio.ServicerContext) -> pb.ClassifyResponse:
        async def classify() -> tuple[pb.ClassifyResponse, int]:
            reply = await self._core.predict(classify_to_core(request), deadline(context))
            return render_predictions(reply), reply.tokens

        return await self._calls.unary("Classify", len(request.inputs), context, classify)

    async def _embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> tuple[bytes, int]:
        """One request through the core: (serialized reply, its token count)."""
        return await self._core.encode(to_core(request), deadline(context), render)


def add_to_server(service: EncoderService, server: grpc.aio.Server) -> None:
    """The generated registration. Embed's and EmbedStream's replies are bytes already: the server must run
    RequestGuard (guard.py), which passes bytes through the generated serializers as they are."""
    encoder_pb2_grpc.add_EncoderServicer_to_server(service, server)
