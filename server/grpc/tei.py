"""text-embeddings-inference's gRPC API (package tei.v1: Info, Embed, Predict, Rerank, Tokenize) on attnserve's gRPC
port, beside attnserve.v1.Encoder and KServe's, so that TEI's gRPC clients switch without a line changed.

It translates protobuf and nothing else: the core validates, batches by length and answers, as for every door;
errors map through status.py and calls are counted under the protocol "tei-grpc" (calls.py). TEI's requests hold one
input each; its streams are answered concurrently, in order (Calls.stream). What TEI's messages cannot say:
- `truncate` is a plain bool in TEI's proto, so false cannot be told from unset: false means "as the server's
  --long-inputs says" (truncate by default, as TEI's --auto-truncate since 1.9), true cuts;
- every call goes to the server's default model (TEI serves one);
- Metadata carries the characters and tokens computed and the total time; the stages' times are not split.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import grpc

from attnserve.engine.output_options import SparseOptions
from attnserve.engine.outputs import EncodeReply
from attnserve.engine.scores import PredictReply, RerankReply
from attnserve.errors import InvalidInputError
from attnserve.tei import tei_pb2 as pb
from attnserve.tei import tei_pb2_grpc

from ..core import Core
from ..metrics import Metrics
from ..models import DTYPE_NAMES
from ..requests import EncodeRequest
from ..score_requests import PredictRequest, RerankRequest
from ..token_requests import DecodeRequest, TokenizeRequest
from .calls import Calls, deadline

PROTOCOL = "tei-grpc"
R = TypeVar("R")  # a reply message
SERVICES = ("Info", "Embed", "Predict", "Rerank", "Tokenize")
REQUEST_TYPES = {m.name: m.input_type.name for name in SERVICES for m in pb.DESCRIPTOR.services_by_name[name].methods}
DIRECTION: dict[int, str] = {pb.TRUNCATION_DIRECTION_RIGHT: "right", pb.TRUNCATION_DIRECTION_LEFT: "left"}


def _truncate(value: bool) -> bool | None:
    """TEI's bool: true cuts; false is also what an unset field reads, so it leaves the server's choice."""
    return True if value else None


def _direction(value: int) -> str:
    if value not in DIRECTION:
        raise InvalidInputError(f"truncation_direction: {value} is not one of TEI's (0: right, 1: left)",
                                field="truncation_direction")
    return DIRECTION[value]


def _metadata(texts: Sequence[str], tokens: int, start: float) -> pb.Metadata:
    return pb.Metadata(compute_chars=sum(len(t) for t in texts), compute_tokens=tokens,
                       total_time_ns=int((time.perf_counter() - start) * 1e9))


class _Tei:
    """What the five services share: the core, and how a call is counted."""

    def __init__(self, core: Core, calls: Calls):
        self._core, self._calls = core, calls

    async def _encode(self, request: EncodeRequest, context: grpc.aio.ServicerContext,
                      render: Callable[[EncodeReply, pb.Metadata], R]) -> tuple[R, int]:
        """The request through the core; render(reply, its metadata) builds the message in the core's thread pool,
        off the event loop, as the other doors' replies are."""
        start = time.perf_counter()
        texts = [x for x in request.inputs if isinstance(x, str)]
        return await self._core.encode(request, deadline(context),
                                       lambda reply: render(reply, _metadata(texts, reply.tokens, start)))


class InfoService(_Tei, tei_pb2_grpc.InfoServicer):
    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        def info() -> pb.InfoResponse:
            info = self._core.info
            kind = (pb.MODEL_TYPE_EMBEDDING if info.kind != "reranker" else
                    pb.MODEL_TYPE_RERANKER if info.num_labels == 1 else pb.MODEL_TYPE_CLASSIFIER)
            return pb.InfoResponse(
                version=info.version, model_id=info.model, model_dtype=DTYPE_NAMES.get(info.precision, info.precision),
                model_type=kind, max_concurrent_requests=info.max_queue_tokens, max_input_length=info.max_seq_length,
                max_batch_tokens=info.max_batch_tokens, max_batch_requests=info.max_batch_size,
                max_client_batch_size=info.max_inputs_per_request, tokenization_workers=self._core.workers)

        return await self._calls.quick("Info", context, info)


class EmbedService(_Tei, tei_pb2_grpc.EmbedServicer):
    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        return await self._calls.unary("Embed", 1, context, lambda: self._embed(request, context))

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest], context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[pb.EmbedResponse]:
        async for reply in self._calls.stream("EmbedStream", requests, context, lambda r: self._embed(r, context)):
            yield reply

    async def _embed(self, request: pb.EmbedRequest, context) -> tuple[pb.EmbedResponse, int]:
        return await self._encode(EncodeRequest(
            inputs=[request.inputs], truncate=_truncate(request.truncate),
            normalize=request.normalize if request.HasField("normalize") else None,
            truncation_direction=_direction(request.truncation_direction),
            prompt_name=request.prompt_name if request.HasField("prompt_name") else None,
            dimensions=request.dimensions if request.HasField("dimensions") else None), context,
            lambda reply, metadata: pb.EmbedResponse(embeddings=reply.embeddings[0].tolist(), metadata=metadata))

    async def EmbedSparse(self, request: pb.EmbedSparseRequest, context: grpc.aio.ServicerContext
                          ) -> pb.EmbedSparseResponse:
        return await self._calls.unary("EmbedSparse", 1, context, lambda: self._sparse(request, context))

    async def EmbedSparseStream(self, requests: AsyncIterator[pb.EmbedSparseRequest],
                                context: grpc.aio.ServicerContext) -> AsyncIterator[pb.EmbedSparseResponse]:
        async for reply in self._calls.stream("EmbedSparseStream", requests, context,
                                              lambda r: self._sparse(r, context)):
            yield reply

    async def _sparse(self, request: pb.EmbedSparseRequest, context) -> tuple[pb.EmbedSparseResponse, int]:
        def render(reply: EncodeReply, metadata: pb.Metadata) -> pb.EmbedSparseResponse:
            sparse = reply.inputs[0].sparse
            assert sparse is not None  # asked for
            return pb.EmbedSparseResponse(sparse_embeddings=[
                pb.SparseValue(index=i, value=v)
                for i, v in zip(sparse.indices.tolist(), sparse.values.tolist(), strict=True)], metadata=metadata)

        return await self._encode(EncodeRequest(
            inputs=[request.inputs], truncate=_truncate(request.truncate),
            truncation_direction=_direction(request.truncation_direction),
            prompt_name=request.prompt_name if request.HasField("prompt_name") else None,
            sparse=SparseOptions(None, False)), context, render)

    async def EmbedAll(self, request: pb.EmbedAllRequest, context: grpc.aio.ServicerContext) -> pb.EmbedAllResponse:
        return await self._calls.unary("EmbedAll", 1, context, lambda: self._all(request, context))

    async def EmbedAllStream(self, requests: AsyncIterator[pb.EmbedAllRequest], context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[pb.EmbedAllResponse]:
        async for reply in self._calls.stream("EmbedAllStream", requests, context, lambda r: self._all(r, context)):
            yield reply

    async def _all(self, request: pb.EmbedAllRequest, context) -> tuple[pb.EmbedAllResponse, int]:
        def render(reply: EncodeReply, metadata: pb.Metadata) -> pb.EmbedAllResponse:
            rows = reply.inputs[0].token_embeddings
            assert rows is not None  # asked for
            return pb.EmbedAllResponse(token_embeddings=[pb.TokenEmbedding(embeddings=row) for row in rows.tolist()],
                                       metadata=metadata)

        return await self._encode(EncodeRequest(
            inputs=[request.inputs], truncate=_truncate(request.truncate),
            truncation_direction=_direction(request.truncation_direction), token_embeddings=True,
            prompt_name=request.prompt_name if request.HasField("prompt_name") else None), context, render)


def _predictions(reply: PredictReply) -> list[pb.Prediction]:
    return [pb.Prediction(label=label, score=score) for label, score in reply.predictions[0]]


class PredictService(_Tei, tei_pb2_grpc.PredictServicer):
    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        return await self._calls.unary("Predict", 1, context, lambda: self._predict(request, context))

    async def PredictPair(self, request: pb.PredictPairRequest, context: grpc.aio.ServicerContext
                          ) -> pb.PredictResponse:
        return await self._calls.unary("PredictPair", 1, context, lambda: self._predict(request, context))

    async def PredictStream(self, requests: AsyncIterator[pb.PredictRequest], context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[pb.PredictResponse]:
        async for reply in self._calls.stream("PredictStream", requests, context,
                                              lambda r: self._predict(r, context)):
            yield reply

    async def PredictPairStream(self, requests: AsyncIterator[pb.PredictPairRequest],
                                context: grpc.aio.ServicerContext) -> AsyncIterator[pb.PredictResponse]:
        async for reply in self._calls.stream("PredictPairStream", requests, context,
                                              lambda r: self._predict(r, context)):
            yield reply

    async def _predict(self, request: pb.PredictRequest | pb.PredictPairRequest, context
                       ) -> tuple[pb.PredictResponse, int]:
        start = time.perf_counter()
        if isinstance(request, pb.PredictPairRequest):
            if len(request.inputs) != 2:
                raise InvalidInputError(f"inputs: a pair is 2 texts, got {len(request.inputs)}", field="inputs")
            texts: list[str] = list(request.inputs)
            item: str | tuple[str, str] = (texts[0], texts[1])
        else:
            texts, item = [request.inputs], request.inputs
        reply = await self._core.predict(PredictRequest(
            inputs=[item], raw_scores=request.raw_scores, truncate=_truncate(request.truncate),
            truncation_direction=_direction(request.truncation_direction)), deadline(context))
        return pb.PredictResponse(predictions=_predictions(reply),
                                  metadata=_metadata(texts, reply.tokens, start)), reply.tokens


def _ranks(reply: RerankReply) -> list[pb.Rank]:
    return [pb.Rank(index=r.index, score=r.score, **({"text": r.text} if r.text is not None else {}))
            for r in reply.results]


class RerankService(_Tei, tei_pb2_grpc.RerankServicer):
    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        async def rerank() -> tuple[pb.RerankResponse, int]:
            return await self._rerank(request.query, list(request.texts), request, context)

        return await self._calls.unary("Rerank", len(request.texts), context, rerank)

    async def RerankStream(self, requests: AsyncIterator[pb.RerankStreamRequest],
                           context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        """One text a message, ranked together once the stream ends (TEI's: the first message's query, raw_scores,
        return_text and truncation apply; a later message's other query is refused, not ignored)."""
        async def rerank() -> tuple[pb.RerankResponse, int]:
            first, texts = None, []
            async for message in requests:
                if first is None:
                    first = message
                elif message.query != first.query:
                    raise InvalidInputError(f"query: message {len(texts)} asks {message.query!r}, the stream's "
                                            f"first {first.query!r}: a stream ranks texts against one query",
                                            field="query")
                texts.append(message.text)
            if first is None:
                raise InvalidInputError("the stream held no message: send one per text", field="text")
            return await self._rerank(first.query, texts, first, context)

        return await self._calls.unary("RerankStream", 0, context, rerank)

    async def _rerank(self, query: str, texts: list[str], options, context) -> tuple[pb.RerankResponse, int]:
        start = time.perf_counter()
        reply = await self._core.rerank(RerankRequest(
            query=query, texts=texts, raw_scores=options.raw_scores, return_text=options.return_text,
            truncate=_truncate(options.truncate), truncation_direction=_direction(options.truncation_direction)),
            deadline(context))
        return pb.RerankResponse(ranks=_ranks(reply),
                                 metadata=_metadata([query, *texts], reply.tokens, start)), reply.tokens


class TokenizeService(_Tei, tei_pb2_grpc.TokenizeServicer):
    async def Tokenize(self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext) -> pb.EncodeResponse:
        return await self._calls.unary("Tokenize", 1, context, lambda: self._tokenize(request))

    async def TokenizeStream(self, requests: AsyncIterator[pb.EncodeRequest], context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[pb.EncodeResponse]:
        async for reply in self._calls.stream("TokenizeStream", requests, context, self._tokenize):
            yield reply

    async def _tokenize(self, request: pb.EncodeRequest) -> tuple[pb.EncodeResponse, int]:
        [tokens] = await self._core.tokenize(TokenizeRequest(
            [request.inputs], request.add_special_tokens,
            request.prompt_name if request.HasField("prompt_name") else None))
        return pb.EncodeResponse(tokens=[pb.SimpleToken(
            id=t.id, text=t.text, special=t.special,
            **({"start": t.start, "stop": t.stop} if t.start is not None and t.stop is not None else {}))
            for t in tokens]), len(tokens)

    async def Decode(self, request: pb.DecodeRequest, context: grpc.aio.ServicerContext) -> pb.DecodeResponse:
        return await self._calls.unary("Decode", 1, context, lambda: self._decode(request))

    async def DecodeStream(self, requests: AsyncIterator[pb.DecodeRequest], context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[pb.DecodeResponse]:
        async for reply in self._calls.stream("DecodeStream", requests, context, self._decode):
            yield reply

    async def _decode(self, request: pb.DecodeRequest) -> tuple[pb.DecodeResponse, int]:
        [text] = await self._core.decode(DecodeRequest([list(request.ids)], request.skip_special_tokens))
        return pb.DecodeResponse(text=text), len(request.ids)


def add_to_server(core: Core, metrics: Metrics, server: grpc.aio.Server) -> None:
    """TEI's five services, on one Calls (protocol "tei-grpc")."""
    calls = Calls(core, metrics, PROTOCOL, REQUEST_TYPES, "set truncate: true")
    tei_pb2_grpc.add_InfoServicer_to_server(InfoService(core, calls), server)
    tei_pb2_grpc.add_EmbedServicer_to_server(EmbedService(core, calls), server)
    tei_pb2_grpc.add_PredictServicer_to_server(PredictService(core, calls), server)
    tei_pb2_grpc.add_RerankServicer_to_server(RerankService(core, calls), server)
    tei_pb2_grpc.add_TokenizeServicer_to_server(TokenizeService(core, calls), server)
