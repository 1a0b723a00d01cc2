"""The gRPC server's answers, over a real loopback connection to a real `attnserve serve` process."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from attnserve.client.client import make_request, to_array, to_result
from attnserve.engine.pooling import l2_normalize
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS


def embed(stub, inputs, **options) -> list:
    return [to_result(e) for e in stub.Embed(make_request(inputs, **options), timeout=60).embeddings]


def test_serving_after_warm_up_and_model_info(server, stub):
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert (info.model, info.hidden_size, info.num_layers, info.num_heads) == (
        "sentence-transformers/all-MiniLM-L6-v2", 384, 6, 12)
    assert (info.max_seq_length, info.vocab_size, info.pooling, info.normalize) == (256, 30522, "mean", True)
    assert (info.provider, info.precision) == ("CPUExecutionProvider", "fp32")
    assert info.limits.max_inputs_per_request == 2048 and info.limits.max_batch_tokens == 2048
    assert info.limits.max_queue_tokens == 65536 and info.limits.max_request_bytes == 4 * 2**20


def test_embeddings_equal_the_offline_engine(stub, engine):
    offline = engine.encode(VARIED_TEXTS)
    results = embed(stub, VARIED_TEXTS, truncate=True)
    served = np.stack([r.sentence_embedding for r in results])
    assert served.shape == (len(VARIED_TEXTS), 384) and served.dtype == np.float32
    np.testing.assert_allclose(served, offline.embeddings, atol=2e-6)
    assert [r.num_tokens for r in results] == offline.num_tokens.tolist()
    assert [r.truncated for r in results] == offline.truncated.tolist() and any(offline.truncated)


def test_pooling_normalize_and_token_embeddings(stub, engine):
    text = "Pooling is chosen per request."
    [default] = embed(stub, [text], normalize=False, token_embeddings=True)
    [cls] = embed(stub, [text], normalize=False, pooling="cls")
    [mean_normalized] = embed(stub, [text], pooling="mean", normalize=True)
    tokens = default.token_embeddings
    assert tokens.shape == (default.num_tokens, 384) and default.tokens[0] == "[CLS]" and default.tokens[-1] == "[SEP]"
    np.testing.assert_allclose(default.sentence_embedding, tokens.mean(axis=0), atol=1e-5)  # MiniLM pools by mean
    np.testing.assert_allclose(cls.sentence_embedding, tokens[0], atol=1e-5)
    np.testing.assert_allclose(mean_normalized.sentence_embedding, l2_normalize(tokens.mean(axis=0)), atol=1e-5)
    assert cls.tokens == []  # word pieces come with token embeddings or attention only


def test_token_id_inputs_equal_text_inputs(stub, engine):
    text = "Token ids and text reach the same embedding."
    ids = engine.tokenizer.encode_texts([text])[0].ids.tolist()
    by_text, by_ids = embed(stub, [text, ids])
    np.testing.assert_allclose(by_text.sentence_embedding, by_ids.sentence_embedding, atol=1e-6)


def test_attention_shape_rows_and_layers(stub, engine):
    texts = ["The cat sat on the mat.", "A second, longer input: attention maps are cut to each input's tokens."]
    results = embed(stub, texts, attention_layers=[0, -1, 2])
    for r in results:
        T = r.num_tokens
        assert r.attentions.shape == (3, 12, T, T) and len(r.tokens) == T
        np.testing.assert_allclose(r.attentions.sum(axis=-1), 1.0, atol=1e-5)
    # The same weights as the PyTorch-verified attention graph, layer by layer: -1 is the last layer.
    ids = engine.tokenizer.encode_texts(texts[:1])
    reference = engine.run(ids, attention=True).attentions[:, 0]  # (L, nh, T, T)
    np.testing.assert_allclose(results[0].attentions, reference[[0, 5, 2]], atol=1e-5)

    [default] = embed(stub, texts[:1], attention_layers=[])
    np.testing.assert_allclose(default.attentions, reference[[5]], atol=1e-5)  # empty: the last layer
    [averaged] = embed(stub, texts[:1], attention_layers=[-6, 1], average_heads=True)
    assert averaged.attentions.shape == (2, 1, default.num_tokens, default.num_tokens)
    np.testing.assert_allclose(averaged.attentions[:, 0], reference[[0, 1]].mean(axis=1), atol=1e-5)
    np.testing.assert_allclose(averaged.attentions.sum(axis=-1), 1.0, atol=1e-5)


def test_attention_and_plain_inputs_in_flight_together(stub, engine):
    """Requests for the two graphs interleave; each gets its own kind of answer."""
    futures = [stub.Embed.future(make_request([f"Request number {i} of a mixed burst."],
                                              attention_layers=[-1] if i % 2 else None), timeout=60)
               for i in range(16)]
    for i, future in enumerate(futures):
        [r] = [to_result(e) for e in future.result().embeddings]
        assert (r.attentions is not None) == bool(i % 2)
        np.testing.assert_allclose(r.sentence_embedding,
                                   engine.encode([f"Request number {i} of a mixed burst."]).embeddings[0], atol=2e-6)


def test_embed_stream_answers_in_order(stub, engine):
    batches = [[f"stream item {i}", "x " * (5 + 40 * (i % 4))] for i in range(30)]  # lengths vary, so order is tested
    replies = list(stub.EmbedStream((make_request(b, truncate=True) for b in batches), timeout=60))
    assert len(replies) == len(batches)
    for batch, reply in zip(batches, replies, strict=True):
        got = np.stack([to_array(e.sentence_embedding) for e in reply.embeddings])
        np.testing.assert_allclose(got, engine.encode(batch).embeddings, atol=2e-6)


def test_embed_stream_error_names_the_request(stub):
    requests = [make_request(["fine"]), make_request(["also fine"]), make_request([""])]
    replies = []
    with pytest.raises(grpc.RpcError) as error:
        for reply in stub.EmbedStream(iter(requests), timeout=30):
            replies.append(reply)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request 2: input 0: empty text" in error.value.details()
    assert len(replies) == 2


def test_reflection_lists_the_services(server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with server.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        [reply] = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=10))
    names = {s.name for s in reply.list_services_response.service}
    assert {"attnserve.v1.Encoder", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


def test_health_list_answers_every_service(server):
    from grpc_health.v1 import health_pb2_grpc

    with server.channel() as channel:
        reply = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=10)
    assert {name: s.status for name, s in reply.statuses.items()} == {
        "": health_pb2.HealthCheckResponse.SERVING, "attnserve.v1.Encoder": health_pb2.HealthCheckResponse.SERVING,
        # each model's own service name, as several models are served (server/models.py)
        "attnserve.v1.Encoder/sentence-transformers/all-MiniLM-L6-v2": health_pb2.HealthCheckResponse.SERVING}


def test_health_of_an_unknown_service_is_not_found_naming_the_services(server):
    from grpc_health.v1 import health_pb2_grpc

    from attnserve.client import error_details

    with server.channel() as channel:
        for service in ("nope", "attnserve.v1.Encoder/no-such-model"):
            with pytest.raises(grpc.RpcError) as error:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            details = error_details(error.value)
            assert details.code == grpc.StatusCode.NOT_FOUND and details.reason == "NOT_FOUND", details
            assert repr(service) in details.message and "'attnserve.v1.Encoder'" in details.message, details.message
        known = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="attnserve.v1.Encoder"), timeout=10)
        assert known.status == health_pb2.HealthCheckResponse.SERVING
