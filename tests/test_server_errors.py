"""gRPC requests that are wrong, on the shared server: bad input is INVALID_ARGUMENT with a message naming the
problem and details naming it for a program (client/status.py); bytes that are not a request message are
MALFORMED_MESSAGE on every method, and a message too large MESSAGE_TOO_LARGE; on a stream the replies due come
first. The server logs no traceback and stays up. Client.embed_stream, the client's EmbedStream, too."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from attnserve.client import Client, ErrorDetails, RequestError, error_details
from attnserve.client.client import make_request
from attnserve.server.grpc.guard import CORE_LIMIT_FACTOR
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS

LONG = "word " * 400  # ~400 tokens, past max_seq_length 256
SERVING = health_pb2.HealthCheckResponse.SERVING

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
    # Refused only when the request says truncate false (tests/test_long_inputs.py: unset cuts by default); the
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
                         "attention.layers[0]", "layer 6 is out of range: this model has 6 layers, 0..5 or -6..-1"),
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
    assert server.health() == SERVING
    assert len(stub.Embed(make_request(["still serving"]), timeout=30).embeddings) == 1


def stream(stub, third) -> tuple[int, grpc.RpcError]:
    """EmbedStream of two good requests, `third`, and one never answered: the replies before the error, and it."""
    replies = 0
    with pytest.raises(grpc.RpcError) as error:
        for _ in stub.EmbedStream(iter([make_request(["one"]), make_request(["two"]), third,
                                        make_request(["never answered"])]), timeout=60):
            replies += 1
    return replies, error.value


def test_a_bad_request_in_a_stream_ends_it_after_the_replies_before_it_and_names_it(stub):
    for case, (request, message, field, description) in BAD_REQUESTS.items():
        replies, error = stream(stub, request)
        details = error_details(error)
        assert replies == 2 and details.message.startswith("request 2: ") and message in details.message, case
        assert (details.code, details.reason, details.request_index, details.field, details.description) == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_INPUT", 2, field, description), case


def test_over_long_input_with_truncate_is_cut_and_marked(stub):
    reply = stub.Embed(make_request([LONG, "short"], truncate=True), timeout=30)
    assert [(e.num_tokens, e.truncated) for e in reply.embeddings] == [(256, True), (3, False)]


def test_the_client_raises_request_error_with_the_details_and_embed_stream_answers_in_order(server):
    batches = [VARIED_TEXTS[:2], ["one more"], VARIED_TEXTS[2:6], [[101, 7592, 102]]]  # texts, and token ids
    with Client(server.target) as client:
        with pytest.raises(RequestError) as error:
            client.embed(["fine", "also fine", ""])
        streamed = list(client.embed_stream(iter(batches), truncate=True))
        alone = [client.embed(batch, truncate=True) for batch in batches]
        unnormalised = next(client.embed_stream([batches[0]], normalize=False, truncate=True))
        failing = client.embed_stream([["fine"], ["", "x"], ["never answered"]])
        assert next(failing).shape == (1, 384)
        with pytest.raises(RequestError) as caught:
            next(failing)
    assert str(error.value) == "INVALID_ARGUMENT: input 2: empty text"
    details = error.value.error_details
    assert (details.input_index, details.reason, details.description) == (2, "INVALID_INPUT", "empty text")
    assert [a.shape for a in streamed] == [(len(batch), 384) for batch in batches]
    for got, expected in zip(streamed, alone, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.all(np.abs(np.linalg.norm(unnormalised, axis=1) - 1) > 1e-3)  # the options reach every request
    details = caught.value.error_details  # naming the request, after the replies before it
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT and details.request_index == 1
    assert details.field == "inputs[0].text" and "request 1: input 0: empty text" in details.message


def test_a_message_over_max_request_bytes_is_refused_in_a_call_or_a_stream_and_past_grpcs_limit_unread(server, stub):
    too_large = ("the request message is 5.0 MiB, over this server's max_request_bytes (4.0 MiB); send fewer or "
                 "shorter inputs per request")  # and no RetryInfo: the same request can never succeed
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(make_request(["x" * (1 << 20)] * 5), timeout=30)  # 5 MiB of text, over the 4 MiB default
    assert error_details(error.value) == ErrorDetails(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large,
                                                      reason="MESSAGE_TOO_LARGE")
    replies, error = stream(stub, make_request(["x" * (5 << 20)]))
    assert replies == 2 and error_details(error) == ErrorDetails(
        grpc.StatusCode.RESOURCE_EXHAUSTED, f"request 2: {too_large}", reason="MESSAGE_TOO_LARGE", request_index=2)
    # The memory bound: past CORE_LIMIT_FACTOR x max_request_bytes grpc's core refuses the message unread.
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(make_request(["x" * (CORE_LIMIT_FACTOR * 4 << 20)]), timeout=60)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in error.value.details()
    assert server.health() == SERVING


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
    assert server.health() == SERVING


# --- request bytes that are not a request message, on every method -----------------------------------------------

CORRUPT = {
    "bytes that are not protobuf": b"\xff" * 8,  # a tag whose varint never ends
    "a field cut short": b"\x0a\x64abc",  # field 1 announces 100 bytes; 3 follow
    "a wire type that does not exist": b"\x0f\x00",  # field 1, wire type 7
    "a group never closed": b"\x0b",  # field 1 opens a group
    "groups nested past protobuf's depth limit": b"\x13" * 200 + b"\x14" * 200,  # field 2, groups in groups
}


def with_bad_utf8(message) -> bytes:
    """message, whose one string field holds "@", with that character replaced by a byte that is not UTF-8."""
    raw = message.SerializeToString()
    assert raw.count(b"@") == 1
    return raw.replace(b"@", b"\xff")


# method: (its kind, a valid request, the same type's request with invalid UTF-8 in a string field or None)
METHODS = {
    "/attnserve.v1.Encoder/Embed": ("unary", make_request(["hello"]), with_bad_utf8(make_request(["@"]))),
    "/attnserve.v1.Encoder/GetModelInfo": ("unary", pb.GetModelInfoRequest(), None),  # it has no string field
    "/grpc.health.v1.Health/Check": ("unary", health_pb2.HealthCheckRequest(),
                                     with_bad_utf8(health_pb2.HealthCheckRequest(service="@"))),
    "/grpc.health.v1.Health/Watch": ("reply stream", health_pb2.HealthCheckRequest(),
                                     with_bad_utf8(health_pb2.HealthCheckRequest(service="@"))),
    "/attnserve.v1.Encoder/EmbedStream": ("stream", make_request(["hello"]), with_bad_utf8(make_request(["@"]))),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": (
        "stream", reflection_pb2.ServerReflectionRequest(list_services=""),
        with_bad_utf8(reflection_pb2.ServerReflectionRequest(host="@"))),
}
CASES = [(method, case, raw) for method, (_, _, bad_utf8) in METHODS.items()
         for case, raw in [*CORRUPT.items(), *([("invalid UTF-8 in a string field", bad_utf8)] if bad_utf8 else [])]]


def call_raw(channel: grpc.Channel, method: str, messages: list[bytes]) -> tuple[int, grpc.RpcError]:
    """Send the raw messages (one, unless the method takes a stream); the replies before the error, and the error."""
    kind = METHODS[method][0]
    replies = 0
    with pytest.raises(grpc.RpcError) as error:
        if kind == "unary":
            channel.unary_unary(method)(messages[0], timeout=30)
        elif kind == "reply stream":  # health Watch: its first reply would be the status; none must come
            for _ in channel.unary_stream(method)(messages[0], timeout=30):
                replies += 1
        else:
            for _ in channel.stream_stream(method)(iter(messages), timeout=30):
                replies += 1
    return replies, error.value


@pytest.mark.parametrize("method,case,raw", CASES, ids=[f"{m.rsplit('/', 1)[1]}: {c}" for m, c, _ in CASES])
def test_a_message_that_does_not_parse_is_invalid_argument_on_every_method(method, case, raw, server):
    kind, valid, _ = METHODS[method]
    good = valid.SerializeToString()
    with server.channel() as channel:
        replies, error = call_raw(channel, method, [good, good, raw, good] if kind == "stream" else [raw])
    details = error_details(error)
    assert (details.code, details.reason, details.field) == (
        grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_MESSAGE", ""), details
    assert "the request message does not parse: Error parsing message" in details.message
    if kind == "stream":
        assert replies == 2  # the replies already due went out before the error
    if method.endswith("/EmbedStream"):
        assert details.request_index == 2 and details.message.startswith("request 2: ")
    assert server.health() == SERVING


def test_refusals_are_counted_by_code_and_the_log_holds_json_lines_only(server, stub):
    """Whether refused by the core (an empty text) or by the guard (bytes that do not parse); and after every
    hostile message above (and whatever ran before in this session): no traceback, no raw line."""
    metric = 'attnserve_requests_total{code="INVALID_ARGUMENT",method="Embed",protocol="grpc"}'
    before = server.metrics().get(metric, 0)
    with pytest.raises(grpc.RpcError):
        stub.Embed(make_request([""]), timeout=30)
    with server.channel() as channel:
        call_raw(channel, "/attnserve.v1.Encoder/Embed", [CORRUPT["a field cut short"]])
    assert server.metrics()[metric] == before + 2
    lines = Path(server.log_path).read_text().splitlines()
    assert lines
    for line in lines:
        assert "Traceback" not in json.loads(line).get("error", ""), line
