"""Bad requests get INVALID_ARGUMENT (or the size limit's code) with a message naming the problem; the server stays up."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from attnserve.client.client import make_request
from attnserve.v1 import encoder_pb2 as pb

LONG = "word " * 400  # ~400 tokens, past max_seq_length 256

BAD_REQUESTS = {
    "no inputs": (pb.EmbedRequest(), "no inputs"),
    "too many inputs": (make_request(["x"] * 257), "too many inputs: 257; this server takes at most 256"),
    "an empty text": (make_request(["fine", "   "]), "input 1: empty text"),
    "an unset input": (pb.EmbedRequest(inputs=[pb.Input(text="ok"), pb.Input()]),
                       "input 1: neither text nor token_ids is set"),
    "a token id past the vocabulary": (make_request([[101, 30522, 102]]), "input 0: token id 30522 is out of range"),
    "a negative token id": (make_request(["ok", [101, -1, 102]]), "input 1: token id -1 is out of range"),
    "an empty token id list": (make_request([[]]), "input 0: empty token id list"),
    "an over-long text without truncate": (make_request(["short", LONG]), "input 1: longer than max_seq_length 256"),
    "over-long token ids without truncate": (make_request([[100] * 300]), "input 0: 300 tokens exceed max_seq_length"),
    "an unknown layer": (make_request(["x"], attention_layers=[6]), "attention.layers[0]: layer 6 does not exist"),
    "an unknown negative layer": (make_request(["x"], attention_layers=[-1, -7]),
                                  "attention.layers[1]: layer -7 does not exist"),
    "an unknown pooling": (pb.EmbedRequest(inputs=[pb.Input(text="x")], pooling=7), "pooling 7 is not one of"),
    "a reply over max_response_bytes": (
        make_request([LONG] * 20, truncate=True, attention_layers=list(range(6))),
        "the reply would be about 360.1 MiB, over this server's max_response_bytes (64.0 MiB)"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_invalid_argument_and_the_server_stays_healthy(case, server, stub):
    request, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert message in error.value.details()
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
    assert len(stub.Embed(make_request(["still serving"]), timeout=30).embeddings) == 1


def test_over_long_input_with_truncate_is_cut_and_marked(stub):
    reply = stub.Embed(make_request([LONG, "short"], truncate=True), timeout=30)
    assert [(e.num_tokens, e.truncated) for e in reply.embeddings] == [(256, True), (3, False)]


def test_request_over_max_request_bytes_gets_a_clear_error(server, stub):
    request = make_request(["x" * (1 << 20)] * 5)  # 5 MiB of text, over the 4 MiB default
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in error.value.details()
    assert server.health() == health_pb2.HealthCheckResponse.SERVING


def test_errors_are_counted_by_code(server, stub):
    before = server.metrics().get('attnserve_requests_total{code="INVALID_ARGUMENT",method="Embed"}', 0)
    with pytest.raises(grpc.RpcError):
        stub.Embed(make_request([""]), timeout=30)
    after = server.metrics()['attnserve_requests_total{code="INVALID_ARGUMENT",method="Embed"}']
    assert after == before + 1
