"""TEI's gRPC API (tei.v1) on attnserve's gRPC port, called as TEI's users call it: through tei-client's GrpcClient
and the stubs tei-client generates from TEI's own proto/tei.proto, nothing of attnserve's. Answers are checked
against the offline engine (embeddings, token embeddings, tokens) and against the HTTP door (reranking)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
import requests
from tei_client import GrpcClient
from tei_client.models import ModelType
from tei_client.stubs import tei_pb2 as theirs
from tei_client.stubs import tei_pb2_grpc as their_stubs

from attnserve.engine.pooling import l2_normalize
from attnserve.tei import tei_pb2 as ours
from tests.conftest import VARIED_TEXTS

TEXTS = [t for t in VARIED_TEXTS if len(t) < 200][:6]
LONG = "the start of a long text " + "filler " * 400


def _fields(message) -> dict[str, tuple]:
    return {f.name: (f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else None,
                     f.enum_type.full_name if f.enum_type else None) for f in message.fields}


def test_the_proto_holds_teis_field_for_field():
    """Every service, method, message, field (name, number, type) and enum value of TEI's own file, as tei-client's
    generated stubs hold it, is attnserve's. tei-client's stubs come from TEI's proto of their release; what TEI
    added since (EmbedRequest's dimensions, normalize and prompt_name made optional: the same numbers and types,
    so the same wire) is in attnserve's, which is TEI's current file."""
    assert ours.DESCRIPTOR.package == theirs.DESCRIPTOR.package == "tei.v1"
    for name, service in theirs.DESCRIPTOR.services_by_name.items():
        mine = {m.name: m for m in ours.DESCRIPTOR.services_by_name[name].methods}
        for method in service.methods:
            m = mine[method.name]
            assert (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming) == (
                method.input_type.full_name, method.output_type.full_name, method.client_streaming,
                method.server_streaming), (name, method.name)
    for name, message in theirs.DESCRIPTOR.message_types_by_name.items():
        mine = _fields(ours.DESCRIPTOR.message_types_by_name[name])
        for field, shape in _fields(message).items():
            assert mine[field] == shape, (name, field)
    for name, enum in theirs.DESCRIPTOR.enum_types_by_name.items():
        mine = {v.name: v.number for v in ours.DESCRIPTOR.enum_types_by_name[name].values}
        assert all(mine[v.name] == v.number for v in enum.values), name


@pytest.fixture(scope="module")
def tei(server):
    # tei-client opens an asyncio channel beside its sync one, which needs a current event loop (another test's
    # asyncio.run may have left none).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    client = GrpcClient(server.target)
    yield client
    client.channel.close()
    loop.run_until_complete(client.async_channel.close())
    del client
    asyncio.set_event_loop(None)
    loop.close()


def test_teis_grpc_client_embeds_as_the_offline_engine(tei, engine):
    info = tei.info()
    assert (info.server_model_id, info.server_model_type, info.max_input_length) == (
        "sentence-transformers/all-MiniLM-L6-v2", ModelType.Embedding, 256)
    assert info.max_client_batch_size == 2048 and info.server_model_dtype == "float32"
    got = np.array(tei.embed(TEXTS), dtype=np.float32)  # EmbedStream, one request a text
    np.testing.assert_allclose(got, engine.encode(TEXTS, normalize=True).embeddings, atol=1e-5)
    [token_rows] = tei.embed_all(TEXTS[:1])  # EmbedAllStream
    want = engine.run(engine.tokenizer.encode_texts(TEXTS[:1])).last_hidden_state[0]
    np.testing.assert_allclose(np.array(token_rows, dtype=np.float32), want, atol=1e-4)


def test_teis_stubs_embed_unary_with_dimensions_truncation_and_metadata(server, engine):
    with grpc.insecure_channel(server.target) as channel:
        embed = their_stubs.EmbedStub(channel)
        # The fields TEI added after tei-client's stubs (dimensions, normalize made optional), written with TEI's
        # current file (attnserve's copy of it, checked above) and read back with tei-client's.
        current = channel.unary_unary("/tei.v1.Embed/Embed", request_serializer=ours.EmbedRequest.SerializeToString,
                                      response_deserializer=theirs.EmbedResponse.FromString)
        reply = current(ours.EmbedRequest(inputs=TEXTS[0], dimensions=64), timeout=60)
        want = l2_normalize(engine.encode(TEXTS[:1], normalize=False).embeddings[:, :64])[0]
        np.testing.assert_allclose(np.array(reply.embeddings, dtype=np.float32), want, atol=1e-5)
        assert reply.metadata.compute_chars == len(TEXTS[0]) and reply.metadata.compute_tokens > 2
        assert reply.metadata.total_time_ns > 0
        # normalize is optional in TEI's current proto (unset: true); false is sent and honoured.
        raw = current(ours.EmbedRequest(inputs=TEXTS[0], normalize=False), timeout=60)
        np.testing.assert_allclose(np.array(raw.embeddings, dtype=np.float32),
                                   engine.encode(TEXTS[:1], normalize=False).embeddings[0], atol=1e-5)
        # truncate false reads as unset: the server's --auto-truncate (on) cuts; left cuts the start.
        left = embed.Embed(theirs.EmbedRequest(inputs=LONG, truncation_direction=theirs.TRUNCATION_DIRECTION_LEFT),
                           timeout=60)
        want = engine.encode_tokenized(engine.tokenizer.encode_texts([LONG], direction="left"), True).embeddings[0]
        np.testing.assert_allclose(np.array(left.embeddings, dtype=np.float32), want, atol=1e-5)
        with pytest.raises(grpc.RpcError) as error:
            embed.Embed(theirs.EmbedRequest(inputs=""), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty text" in error.value.details()
        # A stream's error names the request it answers, after the replies before it.
        stream = embed.EmbedStream(iter([theirs.EmbedRequest(inputs="fine"), theirs.EmbedRequest(inputs=" ")]))
        first = next(stream)
        assert len(first.embeddings) == 384
        with pytest.raises(grpc.RpcError) as error:
            next(stream)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request 1" in error.value.details()


def test_teis_client_tokenizes_and_decodes(tei, engine):
    [result] = tei.tokenize(["hello world"])  # TokenizeStream
    tokens = result.tokens
    assert [t.text for t in tokens] == ["[CLS]", "hello", "world", "[SEP]"]
    assert [t.special for t in tokens] == [True, False, False, True]
    assert [(t.start, t.stop) for t in tokens[1:3]] == [(0, 5), (6, 11)]
    ids = result.get_ids()
    assert ids == engine.tokenizer.encode_texts(["hello world"])[0].ids.tolist()
    assert tei.decode(ids) == "hello world"


def test_teis_stubs_rerank_and_predict_as_the_http_door_does(reranker_server):
    query, texts = "what do cats eat?", ["cats eat fish", "the train is late", "a cat's diet is meat"]
    want = requests.post(f"{reranker_server.http_url}/rerank",
                         json={"query": query, "texts": texts, "return_text": True}, timeout=60).json()
    with grpc.insecure_channel(reranker_server.target) as channel:
        rerank = their_stubs.RerankStub(channel)
        reply = rerank.Rerank(theirs.RerankRequest(query=query, texts=texts, return_text=True), timeout=60)
        assert [(r.index, r.text) for r in reply.ranks] == [(w["index"], w["text"]) for w in want]
        np.testing.assert_allclose([r.score for r in reply.ranks], [w["score"] for w in want], atol=1e-5)
        streamed = rerank.RerankStream(iter([theirs.RerankStreamRequest(query=query, text=t, return_text=True)
                                             for t in texts]), timeout=60)
        assert [(r.index, r.text) for r in streamed.ranks] == [(r.index, r.text) for r in reply.ranks]
        info = their_stubs.InfoStub(channel).Info(theirs.InfoRequest(), timeout=10)
        assert info.model_type == theirs.MODEL_TYPE_RERANKER
        predicted = their_stubs.PredictStub(channel).PredictPair(
            theirs.PredictPairRequest(inputs=[query, texts[0]]), timeout=60)
        score = next(w["score"] for w in want if w["index"] == 0)
        assert len(predicted.predictions) == 1
        np.testing.assert_allclose(predicted.predictions[0].score, score, atol=1e-5)
