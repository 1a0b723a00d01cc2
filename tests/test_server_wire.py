"""Request bytes that are not a request message, or are too large, on every method the server serves.

Each gets INVALID_ARGUMENT (MALFORMED_MESSAGE) or RESOURCE_EXHAUSTED (MESSAGE_TOO_LARGE) with details; on a
stream, the replies due to the messages before it come first; the server logs no traceback and stays up.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from attnserve.client import ErrorDetails, error_details
from attnserve.client.client import make_request
from attnserve.server.grpc.guard import CORE_LIMIT_FACTOR
from attnserve.v1 import encoder_pb2 as pb

# Bytes that no message type parses from.
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
    messages = [good, good, raw, good] if kind == "stream" else [raw]
    with server.channel() as channel:
        replies, error = call_raw(channel, method, messages)
    details = error_details(error)
    assert (details.code, details.reason, details.field) == (
        grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_MESSAGE", ""), details
    assert "the request message does not parse: Error parsing message" in details.message
    if kind == "stream":
        assert replies == 2  # the replies already due went out before the error
    if method.endswith("/EmbedStream"):
        assert details.request_index == 2 and details.message.startswith("request 2: ")
    assert server.health() == health_pb2.HealthCheckResponse.SERVING


def test_a_stream_message_over_max_request_bytes_ends_the_stream_after_the_replies_due(server, stub):
    requests = [make_request(["one"]), make_request(["two"]), make_request(["x" * (5 << 20)]),  # 5 MiB > 4 MiB
                make_request(["never answered"])]
    replies = []
    with pytest.raises(grpc.RpcError) as error:
        for reply in stub.EmbedStream(iter(requests), timeout=60):
            replies.append(reply)
    assert len(replies) == 2
    assert error_details(error.value) == ErrorDetails(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "request 2: the request message is 5.0 MiB, over this server's "
        "max_request_bytes (4.0 MiB); send fewer or shorter inputs per request", reason="MESSAGE_TOO_LARGE",
        request_index=2)  # and no RetryInfo: the same request can never succeed
    assert server.health() == health_pb2.HealthCheckResponse.SERVING


def test_grpc_still_refuses_a_message_over_its_own_higher_limit(server, stub):
    """The memory bound: past CORE_LIMIT_FACTOR x max_request_bytes grpc's core refuses the message unread."""
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(make_request(["x" * (CORE_LIMIT_FACTOR * 4 << 20)]), timeout=60)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Received message larger than max" in error.value.details()
    assert server.health() == health_pb2.HealthCheckResponse.SERVING


def test_refused_messages_are_counted_by_code(server):
    metric = 'attnserve_requests_total{code="INVALID_ARGUMENT",method="Embed",protocol="grpc"}'
    before = server.metrics().get(metric, 0)
    with server.channel() as channel:
        call_raw(channel, "/attnserve.v1.Encoder/Embed", [CORRUPT["a field cut short"]])
    assert server.metrics()[metric] == before + 1


def test_the_server_log_holds_json_lines_only(server):
    """After every hostile message above (and whatever ran before in this session): no traceback, no raw line."""
    lines = Path(server.log_path).read_text().splitlines()
    assert lines
    for line in lines:
        record = json.loads(line)
        assert "Traceback" not in record.get("error", ""), record
