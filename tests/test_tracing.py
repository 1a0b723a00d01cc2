"""OpenTelemetry traces (--otlp-endpoint), received by a real OTLP/gRPC receiver built on the official protos
(opentelemetry-proto's TraceService): the spans of a request sent over HTTP and over gRPC, each the child of the
caller's W3C traceparent, with the model, tokens and batch size."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from attnserve.v1 import encoder_pb2 as pb
from tests.serving import ServerProcess, free_port, serving

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """What an OTLP collector receives: every span exported to it."""

    def __init__(self):
        self.spans, self._lock = [], threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
                for scope in resource.scope_spans:
                    self.spans += [(service, span) for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: bytes) -> list:
        with self._lock:
            return [span for _, span in self.spans if span.trace_id == trace_id]


@pytest.fixture(scope="module")
def receiver():
    port = free_port("127.0.0.1")
    server = grpc.server(futures.ThreadPoolExecutor(4))
    received = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(received, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield received, port
    server.stop(0)


def attributes(span) -> dict:
    return {a.key: next(getattr(a.value, f) for f in ("string_value", "int_value", "bool_value")
                        if a.value.HasField(f)) for a in span.attributes}


def wait_for(receiver: Receiver, trace_id: bytes, names: set[str], timeout: float = 20.0) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        spans = receiver.of_trace(trace_id)
        if names <= {s.name for s in spans}:
            return spans
        time.sleep(0.1)
    raise AssertionError(f"spans of the trace: {sorted(s.name for s in receiver.of_trace(trace_id))}")


def test_a_requests_spans_reach_the_collector_in_the_callers_trace(artifacts, receiver, tmp_path):
    received, port = receiver
    process = ServerProcess(artifacts, "--otlp-endpoint", f"http://127.0.0.1:{port}",
                            env={"OTEL_BSP_SCHEDULE_DELAY": "100"}, log_path=tmp_path / "server.log")
    with serving(process) as server:
        http_trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": ["one text", "two texts"],
                                                                     "model": MODEL},
                           headers={"traceparent": f"00-{http_trace}-{parent}-01"}, timeout=60)
        assert reply.status_code == 200
        spans = wait_for(received, bytes.fromhex(http_trace),
                         {"POST /v1/embeddings", "request", "tokenize", "queue wait", "reply"})
        by_name = {s.name: s for s in spans}
        door = by_name["POST /v1/embeddings"]
        assert door.parent_span_id == bytes.fromhex(parent)  # the caller's span is its parent
        assert by_name["request"].parent_span_id == door.span_id
        for child in ("tokenize", "queue wait", "reply"):
            assert by_name[child].parent_span_id == by_name["request"].span_id, child
        request = attributes(by_name["request"])
        assert request["attnserve.model"] == MODEL and request["attnserve.inputs"] == 2
        assert request["attnserve.tokens"] == reply.json()["usage"]["prompt_tokens"]
        # The batch that ran it: a root span of its own (a batch serves several requests), linked to it.
        batches = [s for _, s in received.spans if s.name == "batch run"
                   and any(link.trace_id == bytes.fromhex(http_trace) for link in s.links)]
        assert len(batches) == 1 and attributes(batches[0])["attnserve.batch_size"] == 2

        grpc_trace = "0af7651916cd43dd8448eb211c80319c"
        with server.channel() as channel:
            server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text="over grpc")]), timeout=60,
                                       metadata=(("traceparent", f"00-{grpc_trace}-b7ad6b7169203331-01"),))
        spans = wait_for(received, bytes.fromhex(grpc_trace), {"Embed", "request", "tokenize", "reply"})
        assert next(s for s in spans if s.name == "Embed").parent_span_id == bytes.fromhex("b7ad6b7169203331")
    assert {service for service, _ in received.spans} == {"attnserve"}
