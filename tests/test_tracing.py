"""OpenTelemetry traces (--otlp-endpoint), received by a real OTLP/gRPC receiver on the official protos
(opentelemetry-proto's TraceService): a request's spans over HTTP and over gRPC, each the child of the caller's W3C
traceparent, with the model, tokens and batch size."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from attnserve.v1 import encoder_pb2 as pb
from tests.serving import ServerProcess, free_port, serving

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """What an OTLP collector receives: every span exported to it, with its service's name."""

    def __init__(self):
        self.spans, self._lock = [], threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
                self.spans += [(service, span) for scope in resource.scope_spans for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, trace: str, names: set[str], timeout: float = 20.0) -> dict:
        """The spans of a trace (hex), by name, once they include `names`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                spans = {s.name: s for _, s in self.spans if s.trace_id == bytes.fromhex(trace)}
            if names <= set(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"spans of the trace: {sorted(spans)}")


def attributes(span) -> dict:
    return {a.key: next(getattr(a.value, f) for f in ("string_value", "int_value", "bool_value")
                        if a.value.HasField(f)) for a in span.attributes}


def test_a_requests_spans_reach_the_collector_in_the_callers_trace(artifacts, tmp_path):
    port, collector, received = free_port("127.0.0.1"), grpc.server(futures.ThreadPoolExecutor(4)), Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(received, collector)
    collector.add_insecure_port(f"127.0.0.1:{port}")
    collector.start()
    process = ServerProcess(artifacts, "--otlp-endpoint", f"http://127.0.0.1:{port}",
                            env={"OTEL_BSP_SCHEDULE_DELAY": "100"}, log_path=tmp_path / "server.log")
    try:
        with serving(process) as server:
            http_trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
            reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": ["one text", "two texts"],
                                                                         "model": MODEL},
                               headers={"traceparent": f"00-{http_trace}-{parent}-01"}, timeout=60)
            assert reply.status_code == 200
            spans = received.wait_for(http_trace, {"POST /v1/embeddings", "request", "tokenize", "queue wait",
                                                   "reply"})
            assert spans["POST /v1/embeddings"].parent_span_id == bytes.fromhex(parent)  # the caller's span
            assert spans["request"].parent_span_id == spans["POST /v1/embeddings"].span_id
            for child in ("tokenize", "queue wait", "reply"):
                assert spans[child].parent_span_id == spans["request"].span_id, child
            request = attributes(spans["request"])
            assert request["attnserve.model"] == MODEL and request["attnserve.inputs"] == 2
            assert request["attnserve.tokens"] == reply.json()["usage"]["prompt_tokens"]
            # The batch that ran it: a root span of its own (a batch serves several requests), linked to it.
            batches = [s for _, s in received.spans if s.name == "batch run"
                       and any(link.trace_id == bytes.fromhex(http_trace) for link in s.links)]
            assert len(batches) == 1 and attributes(batches[0])["attnserve.batch_size"] == 2

            grpc_trace, grpc_parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
            with server.channel() as channel:
                server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text="over grpc")]), timeout=60,
                                           metadata=(("traceparent", f"00-{grpc_trace}-{grpc_parent}-01"),))
            spans = received.wait_for(grpc_trace, {"Embed", "request", "tokenize", "reply"})
            assert spans["Embed"].parent_span_id == bytes.fromhex(grpc_parent)
        assert {service for service, _ in received.spans} == {"attnserve"}
    finally:
        collector.stop(0)
