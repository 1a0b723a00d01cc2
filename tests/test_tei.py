"""text-embeddings-inference's API on both doors, called as TEI's users call it: tei-client's HttpClient and
GrpcClient, and the stubs tei-client generates from TEI's own proto/tei.proto, nothing of attnserve's. Answers are
checked against the offline engine, a reranker's over gRPC against its HTTP door."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest
from tei_client import GrpcClient, HttpClient
from tei_client.models import ModelType, TruncationDirection
from tei_client.stubs import tei_pb2 as theirs
from tei_client.stubs import tei_pb2_grpc as their_stubs

from attnserve.engine.pooling import l2_normalize
from attnserve.tei import tei_pb2 as ours
from attnserve.v1 import encoder_pb2 as pb
from tests.doors import LONG, MODEL, TEXTS


@pytest.fixture(scope="module")
def clients(server):
    # tei-client's GrpcClient opens an asyncio channel beside its sync one, which needs a current event loop
    # (another test's asyncio.run may have left none).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    over_grpc = GrpcClient(server.target)
    pair = {"http": HttpClient(server.http_url, timeout=60), "grpc": over_grpc}
    yield pair
    over_grpc.channel.close()
    loop.run_until_complete(over_grpc.async_channel.close())
    pair.clear()
    del over_grpc  # its __del__ needs the loop still current
    asyncio.set_event_loop(None)
    loop.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_teis_clients_describe_and_embed_as_the_offline_engine(clients, engine, protocol):
    """Over gRPC, embed is EmbedStream (a request a text) and embed_all EmbedAllStream."""
    tei = clients[protocol]
    info = tei.info()
    assert (info.server_model_id, info.server_model_type, info.max_input_length, info.server_model_dtype) == (
        MODEL, ModelType.Embedding, 256, "float32")
    assert info.max_client_batch_size == 2048 and info.max_batch_tokens == 2048 and tei.health()
    np.testing.assert_allclose(np.array(tei.embed(TEXTS), dtype=np.float32),
                               engine.encode(TEXTS, normalize=True).embeddings, atol=1e-5)
    if protocol == "http":  # (tei-client's stubs predate TEI's optional normalize: false is unset over gRPC)
        assert info.server_model_metadata.pooling == "mean"
        raw = np.array(tei.embed(TEXTS[:2], normalize=False), dtype=np.float32)
        np.testing.assert_allclose(raw, engine.encode(TEXTS[:2], normalize=False).embeddings, atol=1e-5)
    for tokens, x in zip(tei.embed_all(TEXTS[:3]), engine.tokenizer.encode_texts(TEXTS[:3]), strict=True):
        np.testing.assert_allclose(np.array(tokens, dtype=np.float32), engine.run([x]).last_hidden_state[0],
                                   atol=1e-4)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_teis_clients_tokenize_and_decode(clients, engine, protocol):
    tei = clients[protocol]
    text = "Héllo,  wörld! Tokenizers split words."
    [result] = tei.tokenize(text)  # over gRPC, TokenizeStream
    assert result.get_ids() == engine.tokenizer.encode_texts([text])[0].ids.tolist()
    first, word, last = result.tokens[0], result.tokens[1], result.tokens[-1]
    assert (first.text, first.special, last.text, last.special) == ("[CLS]", True, "[SEP]", True)
    assert (word.text, word.special, word.start, word.stop) == ("Héllo", False, 0, 5)
    if protocol == "http":
        assert first.start is None
    assert text[result.tokens[3].start:result.tokens[3].stop] == result.tokens[3].text == "wörld"
    [plain] = tei.tokenize(text, add_special_tokens=False)
    assert plain.get_ids() == result.get_ids()[1:-1]
    decoded = tei.decode(result.get_ids())
    assert decoded == (["hello, world! tokenizers split words."] if protocol == "http" else
                       "hello, world! tokenizers split words.")
    assert tei.decode([result.get_ids()[:3], [101, 102]], skip_special_tokens=False) == ["[CLS] hello,", "[CLS] [SEP]"]


def test_http_info_gives_every_field_of_teis_info_with_its_type(server):
    """TEI's Info schema: integers where it says integer, and the served_model_name TEI's --served-model-name
    sets."""
    info = httpx.get(f"{server.http_url}/info", timeout=30).json()
    assert info["served_model_name"] == info["model_id"] == MODEL
    for name in ("max_concurrent_requests", "tokenization_workers", "max_input_length", "max_batch_tokens",
                 "max_client_batch_size"):
        assert isinstance(info[name], int) and info[name] >= 1, name


def test_http_embed_truncates_from_either_end(clients, engine):
    tei = clients["http"]
    # Over-long with truncate false: refused, naming the fix (this client hands the error body back as it is).
    assert tei.embed([LONG], truncate=False) == {
        "error": "input 0: longer than max_seq_length 256 tokens, and the request asked not to truncate; to cut it "
                 'to max_seq_length instead, set "truncate": true in the body', "error_type": "Validation"}
    right = np.array(tei.embed([LONG], truncate=True), dtype=np.float32)[0]
    left = np.array(tei.embed([LONG], truncate=True, truncation_direction=TruncationDirection.Left),
                    dtype=np.float32)[0]
    [kept_left] = engine.tokenizer.encode_texts([LONG], direction="left")
    assert kept_left.truncated and len(kept_left) == 256
    assert engine.tokenizer.tokens(kept_left.ids)[-3:] == ["ending", "!", "[SEP]"]
    np.testing.assert_allclose(right, engine.encode([LONG]).embeddings[0], atol=1e-5)
    np.testing.assert_allclose(left, engine.encode_tokenized([kept_left]).embeddings[0], atol=1e-5)
    assert float(right @ left) < 0.99  # the two ends are different texts


def test_http_dimensions_pooling_and_errors(server, stub, engine):
    """`pooling` on /embed and /v1/embeddings, as gRPC's EmbedRequest.pooling: CLS pooling gives gRPC's vectors;
    an unknown pooling is refused, naming it; errors in TEI's shape."""
    post = lambda route, body: httpx.post(f"{server.http_url}{route}", json=body, timeout=60)
    reply = post("/embed", {"inputs": TEXTS[:2], "dimensions": 32})
    assert reply.status_code == 200, reply.text
    raw = engine.encode(TEXTS[:2], normalize=False).embeddings
    np.testing.assert_allclose(np.array(reply.json(), dtype=np.float32), l2_normalize(raw[:, :32]), atol=1e-5)
    texts = TEXTS[:4]
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts], pooling=pb.CLS, normalize=True))
    want = np.stack([np.frombuffer(e.sentence_embedding.data, "<f4") for e in reply.embeddings])
    cls = np.array(post("/embed", {"inputs": texts, "pooling": "cls"}).json(), dtype=np.float32)
    openai = post("/v1/embeddings", {"input": texts, "model": "", "pooling": "cls"}).json()
    np.testing.assert_allclose(cls, want, atol=1e-5)
    np.testing.assert_allclose(np.array([d["embedding"] for d in openai["data"]], dtype=np.float32), want, atol=1e-5)
    mean = np.array(post("/embed", {"inputs": texts}).json())
    assert np.abs(mean - cls).max() > 1e-2  # the model's own (mean) pooling is another
    refused = post("/embed", {"inputs": texts, "pooling": "max"})
    assert refused.status_code in (400, 422) and "pooling" in refused.json()["error"]
    for route, body, message in [
            ("/embed", {"inputs": ["fine", ""]}, "input 1: empty text"),
            ("/embed_all", {"inputs": [[101, 99999, 102]]}, "input 0: token id 99999 is out of range"),
            ("/tokenize", {"inputs": "x", "prompt_name": "query"}, "prompt_name 'query' does not exist"),
            ("/decode", {"ids": "nope"}, "ids: must be a list of token ids or a list of lists")]:
        reply = post(route, body)
        assert reply.status_code == 400 and reply.json()["error_type"] == "Validation", (route, reply.text)
        assert reply.json()["error"].startswith(message), (route, reply.text)


def _fields(message) -> dict[str, tuple]:
    return {f.name: (f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else None,
                     f.enum_type.full_name if f.enum_type else None) for f in message.fields}


def test_the_proto_holds_teis_field_for_field():
    """Every service, method, message, field (name, number, type) and enum value of TEI's own file, as tei-client's
    generated stubs hold it, is attnserve's. What TEI added since tei-client's release (EmbedRequest's dimensions,
    normalize and prompt_name made optional: the same numbers and types, so the same wire) is in attnserve's."""
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
        long = "the start of a long text " + "filler " * 400
        left = embed.Embed(theirs.EmbedRequest(inputs=long, truncation_direction=theirs.TRUNCATION_DIRECTION_LEFT),
                           timeout=60)
        want = engine.encode_tokenized(engine.tokenizer.encode_texts([long], direction="left"), True).embeddings[0]
        np.testing.assert_allclose(np.array(left.embeddings, dtype=np.float32), want, atol=1e-5)
        with pytest.raises(grpc.RpcError) as error:
            embed.Embed(theirs.EmbedRequest(inputs=""), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty text" in error.value.details()
        # A stream's error names the request it answers, after the replies before it.
        stream = embed.EmbedStream(iter([theirs.EmbedRequest(inputs="fine"), theirs.EmbedRequest(inputs=" ")]))
        assert len(next(stream).embeddings) == 384
        with pytest.raises(grpc.RpcError) as error:
            next(stream)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request 1" in error.value.details()


def test_teis_stubs_rerank_and_predict_as_the_http_door_does(reranker_server):
    query, texts = "what do cats eat?", ["cats eat fish", "the train is late", "a cat's diet is meat"]
    want = httpx.post(f"{reranker_server.http_url}/rerank", json={"query": query, "texts": texts, "return_text": True},
                      timeout=60).json()
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
        assert len(predicted.predictions) == 1
        np.testing.assert_allclose(predicted.predictions[0].score, next(w["score"] for w in want if w["index"] == 0),
                                   atol=1e-5)
