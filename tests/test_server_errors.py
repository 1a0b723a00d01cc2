"""Bad requests get INVALID_ARGUMENT (or the size limit's code) with a message naming the problem and details
that name it for a program (client/status.py); the server stays up."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from attnserve.client import Client, ErrorDetails, RequestError, error_details
from attnserve.client.client import make_request
from attnserve.v1 import encoder_pb2 as pb

LONG = "word " * 400  # ~400 tokens, past max_seq_length 256

# case: (request, the message, the BadRequest field, its description: the problem alone)
BAD_REQUESTS = {
    "no inputs": (pb.EmbedRequest(), "no inputs", "inputs", "no inputs: send 1 to 2048 inputs"),
    "too many inputs": (make_request(["x"] * 2049), "too many inputs: 2049; this server takes at most 2048", "inputs",
                        "too many inputs: 2049; this server takes at most 2048 per request"),
    "an empty text": (make_request(["fine", "   "]), "input 1: empty text", "inputs[1].text", "empty text"),
    "an unset input": (pb.EmbedRequest(inputs=[pb.Input(text="ok"), pb.Input()]),
                       "input 1: neither text nor token_ids is set", "inputs[1]", "neither text nor token_ids is set"),
    "a token id past the vocabulary": (make_request([[101, 30522, 102]]), "input 0: token id 30522 is out of range",
                                       "inputs[0].token_ids", "token id 30522 is out of range [0, 30522)"),
    "a negative token id": (make_request(["ok", [101, -1, 102]]), "input 1: token id -1 is out of range",
                            "inputs[1].token_ids", "token id -1 is out of range [0, 30522)"),
    "an empty token id list": (make_request(["ok"] * 10 + [[]]), "input 10: empty token id list",
                               "inputs[10].token_ids", "empty token id list"),
    # Refused only when the request says truncate false (tests/test_auto_truncate.py: unset cuts by default); the
    # message names the fix, the BadRequest description the problem alone.
    "an over-long text with truncate false": (
        make_request(["short", LONG], truncate=False),
        "input 1: longer than max_seq_length 256 tokens, and the request asked not to truncate; to cut it to "
        "max_seq_length instead, set truncate: true (field `truncate` of EmbedRequest)",
        "inputs[1].text", "longer than max_seq_length 256 tokens"),
    "over-long token ids with truncate false": (make_request([[100] * 300], truncate=False),
                                                "input 0: 300 tokens exceed max_seq_length", "inputs[0].token_ids",
                                                "300 tokens exceed max_seq_length 256"),
    "an unknown layer": (make_request(["x"], attention_layers=[6]), "attention.layers[0]: layer 6 is out of range",
                         "attention.layers[0]",
                         "layer 6 is out of range: this model has 6 layers, 0..5 or -6..-1"),
    "an unknown negative layer": (make_request(["x"], attention_layers=[-1, -7]),
                                  "attention.layers[1]: layer -7 is out of range", "attention.layers[1]",
                                  "layer -7 is out of range: this model has 6 layers, 0..5 or -6..-1"),
    "an unknown pooling": (pb.EmbedRequest(inputs=[pb.Input(text="x")], pooling=7), "pooling 7 is not one of",
                           "pooling", "pooling 7 is not one of default, mean, cls"),
    "dimensions above the hidden size": (make_request(["x"], dimensions=385), "dimensions 385 is out of range",
                                         "dimensions", "dimensions 385 is out of range: this model's embeddings have "
                                                       "384 (ask for 1 to 384)"),
    "dimensions below 1": (make_request(["x"], dimensions=0), "dimensions 0 is out of range", "dimensions",
                           "dimensions 0 is out of range: this model's embeddings have 384 (ask for 1 to 384)"),
    "an unknown head": (make_request(["x"], attention_layers=[-1], attention_heads=[0, 12]),
                        "attention.heads[1]: head 12 is out of range", "attention.heads[1]",
                        "head 12 is out of range: this model has 12 heads, 0..11 or -12..-1"),
    "an unknown truncation direction": (pb.EmbedRequest(inputs=[pb.Input(text="x")], truncation_direction=5),
                                        "truncation_direction 5 is not one of right, left", "truncation_direction",
                                        "truncation_direction 5 is not one of right, left"),
    "a reply over max_response_bytes": (
        make_request([LONG] * 20, truncate=True, attention_layers=list(range(6))),
        "the reply would be about 360.1 MiB, over this server's max_response_bytes (64.0 MiB)", "",
        "the reply would be about 360.1 MiB, over this server's max_response_bytes (64.0 MiB); ask for fewer inputs, "
        "fewer attention layers or average_heads"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_invalid_argument_and_the_server_stays_healthy(case, server, stub):
    request, message, field, description = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert message in error.value.details()
    assert error_details(error.value) == ErrorDetails(
        grpc.StatusCode.INVALID_ARGUMENT, error.value.details(), reason="INVALID_INPUT", field=field,
        description=description)
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
    assert len(stub.Embed(make_request(["still serving"]), timeout=30).embeddings) == 1


def test_a_bad_request_in_a_stream_ends_it_after_the_replies_before_it_and_names_it(stub):
    """Every bad-input case as the third request of an EmbedStream: two replies, then its error, request 2."""
    for case, (request, message, field, description) in BAD_REQUESTS.items():
        replies = []
        with pytest.raises(grpc.RpcError) as error:
            for reply in stub.EmbedStream(iter([make_request(["one"]), make_request(["two"]), request,
                                                make_request(["never answered"])]), timeout=30):
                replies.append(reply)
        assert len(replies) == 2, case
        details = error_details(error.value)
        assert details.message.startswith("request 2: ") and message in details.message, (case, details)
        assert (details.code, details.reason, details.request_index, details.field, details.description) == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_INPUT", 2, field, description), case


def test_the_client_raises_request_error_with_the_details(server):
    with Client(server.target) as client:
        with pytest.raises(RequestError) as error:
            client.embed(["fine", "also fine", ""])
    assert str(error.value) == "INVALID_ARGUMENT: input 2: empty text"
    assert error.value.error_details.input_index == 2
    assert (error.value.error_details.reason, error.value.error_details.description) == ("INVALID_INPUT", "empty text")


def test_over_long_input_with_truncate_is_cut_and_marked(stub):
    reply = stub.Embed(make_request([LONG, "short"], truncate=True), timeout=30)
    assert [(e.num_tokens, e.truncated) for e in reply.embeddings] == [(256, True), (3, False)]


def test_request_over_max_request_bytes_gets_a_clear_error(server, stub):
    request = make_request(["x" * (1 << 20)] * 5)  # 5 MiB of text, over the 4 MiB default
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(request, timeout=30)
    assert error_details(error.value) == ErrorDetails(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "the request message is 5.0 MiB, over this server's max_request_bytes "
        "(4.0 MiB); send fewer or shorter inputs per request", reason="MESSAGE_TOO_LARGE")  # no RetryInfo: no retry
    assert server.health() == health_pb2.HealthCheckResponse.SERVING


def test_errors_are_counted_by_code(server, stub):
    before = server.metrics().get('attnserve_requests_total{code="INVALID_ARGUMENT",method="Embed",protocol="grpc"}', 0)
    with pytest.raises(grpc.RpcError):
        stub.Embed(make_request([""]), timeout=30)
    after = server.metrics()['attnserve_requests_total{code="INVALID_ARGUMENT",method="Embed",protocol="grpc"}']
    assert after == before + 1


# Requests whose error quotes what the client sent, at a length past any client's metadata limit: the message (and
# the BadRequest description) travel in the trailers, so unbounded they were dropped by the client, which saw
# RESOURCE_EXHAUSTED "Stream removed" in place of the status.
LONG_NAME = "模型/" * 3000  # 15,000 UTF-8 bytes, 3-byte characters: percent-encoded, three times that
QUOTING_REQUESTS = {
    "an unknown model in Embed": ("Embed", pb.EmbedRequest(inputs=[pb.Input(text="x")], model=LONG_NAME),
                                  grpc.StatusCode.NOT_FOUND),
    "an unknown model in GetModelInfo": ("GetModelInfo", pb.GetModelInfoRequest(model=LONG_NAME),
                                         grpc.StatusCode.NOT_FOUND),
    "an unknown model in Rerank": ("Rerank", pb.RerankRequest(query="q", texts=["t"], model=LONG_NAME),
                                   grpc.StatusCode.NOT_FOUND),
    "an unknown prompt name": ("Embed", pb.EmbedRequest(inputs=[pb.Input(text="x")], prompt_name="p" * 40_000),
                               grpc.StatusCode.INVALID_ARGUMENT),
}


@pytest.mark.parametrize("case", list(QUOTING_REQUESTS))
def test_an_error_quoting_a_long_value_arrives_with_its_status_cut_to_fit(case, server, stub):
    method, request, code = QUOTING_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as error:
        getattr(stub, method)(request, timeout=30)
    details = error_details(error.value)
    assert details.code == code, details
    assert details.message.endswith("…(cut)") and len(details.message.encode()) <= 1024, details.message[-40:]
    assert details.description is None or len(details.description.encode()) <= 1024
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
